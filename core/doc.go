// Package core holds tollgate's policies, decisions and store contract. A
// Policy is a named stack of limits (package algo) applied to one key,
// optionally scaled by an adaptive controller (package adaptive); a Store
// keeps one State per limit per key and applies a Policy atomically (the
// memory store under a per-shard lock, the Redis store in one Lua script
// that mirrors the Go step functions); a Decision is what it decided.
// What a Store implementation calls on a policy (its step functions on one
// key's state, the identities that name that state) is the policy's
// StoreSide; a Policy's own methods are what users build and read it with.
//
// Core imports no gateway code and names no gateway. Its other concepts sit
// in packages beside it: algo (algorithms and limits), adaptive (adaptive
// control), headers (rendering a decision), spec (configuration) and gate
// (the request pipeline an adapter runs).
package core
