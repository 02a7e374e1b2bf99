package adaptive

import _ "embed" // the Lua twins of the adaptive rules, run by the Redis store

// AIMDLua is the Lua twin of AIMD (aimd.lua beside aimd.go): one node's
// verdict applied to a policy's fleet-wide factor, kept in a Redis hash.
//
//go:embed aimd.lua
var AIMDLua string

// GradientLua is the Lua twin of Gradient (gradient.lua beside
// gradient.go): one node's interval signals added to a policy's fleet-wide
// sums, judged once per interval, kept in a Redis hash.
//
//go:embed gradient.lua
var GradientLua string
