package kongplugin

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core/gate"
)

// parked are the in-flight leases of requests between Kong's access and log
// phases, which run as separate events of the plugin server and cannot pass
// Go values between them: id → the function that ends them.
var (
	parked   sync.Map
	parkedID atomic.Uint64
)

// parkLeases holds the outcome's leases as gate.Outcome.HoldLeases does and
// returns an id to carry to the log phase in kong.ctx.shared (see
// endParkedLeases), or "" when the request holds none. If the id never
// comes back (a request Kong ends without a log phase), the leases end
// after maxHold.
func parkLeases(o *gate.Outcome, maxHold time.Duration) string {
	if !o.HoldsLeases() {
		return ""
	}
	end := o.HoldLeases(maxHold)
	id := strconv.FormatUint(parkedID.Add(1), 36)
	parked.Store(id, end)
	time.AfterFunc(maxHold, func() { endParkedLeases(id) })
	return id
}

// endParkedLeases ends the leases parkLeases parked under id (once; an
// unknown id does nothing).
func endParkedLeases(id string) {
	if end, ok := parked.LoadAndDelete(id); ok {
		end.(func())()
	}
}
