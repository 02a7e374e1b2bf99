package redis

import (
	"crypto/sha256"
	_ "embed" // the store's Lua scripts
	"encoding/hex"

	"github.com/tollgate/tollgate/core/algo"
)

// DecideLua is the script a decision runs (one EVALSHA) where Redis
// takes no functions: algo.Lua, the step functions' Lua twins, then this
// store's part in lua/: state.lua (a state's stored form), protocol.lua
// (its KEYS, ARGV and reply, documented at its top, and how keys expire),
// decide.lua (one request's limits stepped all or nothing, written and
// answered) and batch.lua (one request, or a batch of them on standalone
// Redis and Sentinel).
var DecideLua = decideParts + "return decide_call()\n"

// DecideLibrary is the same code as a Redis function library (Redis 7 and
// later), which a decision calls with FCALL DecideFunction. Redis runs a
// library's definitions once, when it loads it, where a script runs them
// on every call: about a third of a one-request call's time. Library and
// function are named after the code's hash, so gateways running two
// versions of tollgate against one Redis (a rolling upgrade) each call
// their own.
var DecideLibrary = "#!lua name=" + DecideFunction + "\n" +
	// The script form's KEYS and ARGV, bound per call.
	"local KEYS, ARGV\n" + decideParts +
	"redis.register_function('" + DecideFunction + "', function(keys, args)\n" +
	"  KEYS, ARGV = keys, args\n" +
	"  return decide_call()\n" +
	"end)\n"

// DecideFunction names DecideLibrary and the one function it registers.
var DecideFunction = "tollgate_decide_" + codeHash(decideParts)

var decideParts = algo.Lua + stateLua + protocolLua + decideLua + batchLua

// codeHash is a short hex digest of code: 64 bits of its SHA-256.
func codeHash(code string) string {
	sum := sha256.Sum256([]byte(code))
	return hex.EncodeToString(sum[:8])
}

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
