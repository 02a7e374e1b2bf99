// Package core holds tollgate's rate-limiting algorithms, limits, policies,
// decisions and header rendering. It imports no gateway code and names no
// gateway: the gateway plugins and the net/http middleware are thin adapters
// over it.
//
// Every algorithm is one pure step function over a small State
// (see Step). A Store keeps one State per limit per key and applies a Policy
// (a stack of limits) atomically: the memory store under a per-shard lock,
// the Redis store in one Lua script that mirrors the Go step functions.
//
// Time inside the core is an int64 count of microseconds (µs). Microseconds
// are what Redis TIME returns and they keep every quantity the Lua scripts
// compute below 2^53, where Lua's doubles are still exact integers.
package core
