package algo

import _ "embed" // the Lua twins of the Go rules, run by the Redis store

// StepLua is the Lua twin of Step and Policy.Apply (step.lua beside
// step.go): it decides one request for every stacked limit of a policy, all
// or nothing, with the same integer arithmetic, in one Redis EVALSHA. Its
// KEYS and ARGV are documented at step.lua's top; state.lua, which begins
// it, stores each limit's state.
var StepLua = stateLua + stepLua

// stateLua is the stored form of a limit's state, read and written by
// StepLua and CancelLua (each begins with it).
//
//go:embed state.lua
var stateLua string

//go:embed step.lua
var stepLua string

// LeaseLua is the Lua twin of EndLease and Policy.ApplyLease (lease.lua
// beside step.lua): it ends or renews the leases one request holds in a
// policy's in_flight limits, in one Redis EVALSHA.
//
//go:embed lease.lua
var LeaseLua string

// CancelLua is the Lua twin of CancelShaped and Policy.ApplyCancel
// (cancel.lua beside step.lua): it gives back the places a shaped request
// took in a policy's leaky_bucket limits, in one Redis EVALSHA. It begins
// with state.lua, as StepLua does.
var CancelLua = stateLua + cancelLua

//go:embed cancel.lua
var cancelLua string
