// Package gate is the request pipeline an adapter runs: a Gate holds a
// config's rules (a limiter and how it keys requests), decides a request
// against each, holds in-flight leases and shaping delays, feeds adaptive
// controllers what the upstream answered, keeps the heaviest denied keys,
// and renders the outcome's headers and denial.
package gate
