// Package adaptive holds adaptive control: a Controller that follows an
// upstream's health (errors, latency, work in flight) and moves a factor
// between Options.MinFactor and 1 that scales a policy's limits. The rules
// that move it are decided once each, in Go and in Lua: Gradient
// (gradient.go, gradient.lua) and AIMD (aimd.go, aimd.lua); the Redis store
// runs the Lua twins to share one factor across a fleet.
package adaptive
