package redis

import (
	_ "embed" // the store's Lua scripts

	"github.com/tollgate/tollgate/core/algo"
)

// DecideLua is the script every decision runs (one EVALSHA): algo.Lua,
// the step functions' Lua twins, then this store's part in lua/:
// state.lua (a state's stored form), protocol.lua (its KEYS, ARGV and
// reply, documented at its top, and how keys expire), decide.lua (one
// request's limits stepped all or nothing, written and answered) and
// batch.lua (one request, or a batch of them on standalone Redis and
// Sentinel).
var DecideLua = algo.Lua + stateLua + protocolLua + decideLua + batchLua

// cancelLua gives back a shaped request's places (algo.Lua's
// cancel_shaped on the state hash); leaseLua ends or renews a request's
// leases. countLua adds to a window's shared count (eventual mode).
var cancelLua = algo.Lua + stateLua + cancelPartLua

var (
	//go:embed lua/state.lua
	stateLua string
	//go:embed lua/protocol.lua
	protocolLua string
	//go:embed lua/decide.lua
	decideLua string
	//go:embed lua/batch.lua
	batchLua string
	//go:embed lua/cancel.lua
	cancelPartLua string
	//go:embed lua/lease.lua
	leaseLua string
	//go:embed lua/count.lua
	countLua string
)
