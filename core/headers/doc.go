// Package headers renders a decision as rate-limit response headers: the
// IETF RateLimit and RateLimit-Policy fields, the X-RateLimit set, the
// per-limit set, and Retry-After with its jitter. It reads decisions and
// policies; it decides nothing.
package headers
