package algo

import _ "embed" // the Lua twins of the Go rules, run by the Redis store

// Lua is the step functions' Lua twins (step.go's, beside them in six
// pieces: arith, windows, buckets, penalty, charge, logs), for a store's
// script to begin with and call: steps[code] for an algorithm whose state
// is three integers, logged_step for the sliding log and in_flight over a
// sorted set, charges[code], penalize and penalty, cancel_shaped. They
// compute with the same integer arithmetic as the Go step functions; how
// a store passes limits and states in and out is the store's own.
var Lua = arithLua + windowsLua + bucketsLua + penaltyLua + chargeLua + logsLua

var (
	//go:embed arith.lua
	arithLua string
	//go:embed windows.lua
	windowsLua string
	//go:embed buckets.lua
	bucketsLua string
	//go:embed penalty.lua
	penaltyLua string
	//go:embed charge.lua
	chargeLua string
	//go:embed logs.lua
	logsLua string
)
