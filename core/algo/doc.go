// Package algo holds tollgate's rate-limiting algorithms and the limits they
// read. Each algorithm is decided in exactly one place: its step function
// in step.go (Step: a pure function of a Limit, a small State, the time and
// a cost) and its Lua twin beside it (Lua: arith.lua, windows.lua,
// buckets.lua, penalty.lua, charge.lua and logs.lua), which the Redis
// store's scripts begin with and call. Nothing else computes a
// window, a count, a reset or a retry-after.
//
// Time here is an int64 count of microseconds (µs): what Redis TIME returns,
// and small enough that every quantity the Lua twins compute stays below
// 2^53, where Lua's doubles are still exact integers.
package algo
