package kongplugin

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core"
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

// parkedCharges are the charges of requests between Kong's access and log
// phases (see parkCharges): id → *parkedCharge.
var (
	parkedCharges sync.Map
	chargesParked atomic.Uint64
)

// parkedCharge is one request's outcome, kept for its log phase, and when
// it was parked (core.MonotonicNow).
type parkedCharge struct {
	outcome gate.Outcome
	at      time.Duration
	// seen is what the access phase saw that the response needs, for a
	// plugin that keeps something (see responseLimits).
	seen any
}

// sweepEvery is how many parked requests pass between sweeps of those
// whose log phase never came.
const sweepEvery = 4096

// parkCharges holds the outcome's charges for the log phase and returns
// an id to carry there in kong.ctx.shared, or "" when the request has none.
// If the id never comes back (a request Kong ends without a log phase),
// the charges are dropped by a sweep once maxHold has passed: no timer per
// request.
func parkCharges(o *gate.Outcome, seen any) string {
	if !o.Charges() {
		return ""
	}
	id := strconv.FormatUint(parkedID.Add(1), 36)
	now := core.MonotonicNow()
	parkedCharges.Store(id, &parkedCharge{outcome: *o, at: now, seen: seen})
	if chargesParked.Add(1)%sweepEvery == 0 {
		parkedCharges.Range(func(k, v any) bool {
			if now-v.(*parkedCharge).at > maxHold {
				parkedCharges.Delete(k)
			}
			return true
		})
	}
	return id
}

// takeParkedCharges returns what parkCharges parked under id, once (nil for
// an unknown id).
func takeParkedCharges(id string) *parkedCharge {
	if v, ok := parkedCharges.LoadAndDelete(id); ok {
		return v.(*parkedCharge)
	}
	return nil
}
