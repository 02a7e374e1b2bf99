package redis

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/storetest"
)

// packedState is a state in the form lua/state.lua stores: a format byte
// (1) and four little-endian doubles, the state's three integers and the
// hash's expiry (Unix ms).
func packedState(a, b, c, expires float64) string {
	v := []byte{1}
	for _, x := range []float64{a, b, c, expires} {
		v = binary.LittleEndian.AppendUint64(v, math.Float64bits(x))
	}
	return string(v)
}

// unpackState reads a packedState; ok is false for any other value.
func unpackState(v string) (state [4]float64, ok bool) {
	if len(v) != 33 || v[0] != 1 {
		return state, false
	}
	for i := range state {
		state[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[1+8*i:])))
	}
	return state, true
}

// A state stored in the text form of earlier releases ("a b c") is read, so
// an upgrade keeps every count, and written back packed; a stored value
// that is neither form fails its own request with an error that says so
// (alone, and within a batch, where the other requests are still decided).
func TestStoredStateForms(t *testing.T) {
	ctx := context.Background()
	p := core.MustPolicy("forms", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Hour, Algorithm: algo.FixedWindow})
	field := p.StoreSide().LimitID(0)
	start := storetest.T0 - storetest.T0%time.Hour.Microseconds()
	admin := adminClient(t)
	for _, batch := range []int{1, 0} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			clock := &core.ManualClock{Micros: storetest.T0}
			s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Batch: batch, Clock: clock, NoDenyCache: true})
			hash := s.Keys(p, "upgraded")[0]
			// 7 of 10 used this hour, as an earlier release stored it.
			if err := admin.HSet(ctx, hash, field, strconv.FormatInt(start, 10)+" 7 0").Err(); err != nil {
				t.Fatal(err)
			}
			var d core.Decision
			if err := s.Decide(ctx, p, "upgraded", 1, &d); err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("over a text state of 7 used: err %v, %+v; want allowed with 2 left", err, d)
			}
			v := admin.HGet(ctx, hash, field).Val()
			if got, ok := unpackState(v); !ok || got[0] != float64(start) || got[1] != 8 || got[2] != 0 || got[3] <= 0 {
				t.Fatalf("state written back as %q, want the packed form of (%d, 8, 0) and an expiry", v, start)
			}
			if err := s.Decide(ctx, p, "upgraded", 2, &d); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("over the packed state of 8 used: err %v, %+v; want allowed with 0 left", err, d)
			}

			for _, bad := range []string{
				"garbage",
				"1 2",                                          // text cut short
				"\x01short",                                    // packed, cut short
				packedState(math.NaN(), 0, 0, 0),               // a number that is no count
				packedState(float64(start), 0.5, 0, 0),         // not an integer
				packedState(float64(start), 1e300, 0, 0),       // beyond what Lua holds exactly
				packedState(float64(start), 0, 0, -1),          // an expiry before 1970
				packedState(float64(start), 0, 0, math.Inf(1)), // an expiry never
				"99999999999999999999999 1 0",                  // beyond what Lua holds exactly, as text
				packedState(float64(start), 0, 0, 0) + "x",     // a byte too many
				packedState(float64(start), 0, 0, 0)[:25],      // the three integers alone
			} {
				if err := admin.HSet(ctx, s.Keys(p, "corrupt")[0], field, bad).Err(); err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				errs := make([]error, 8)
				for i := range errs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := "fine-" + strconv.Itoa(i)
						if i == 0 {
							key = "corrupt"
						}
						var d core.Decision
						errs[i] = s.Decide(ctx, p, key, 1, &d)
					}()
				}
				wg.Wait()
				if errs[0] == nil || !strings.Contains(errs[0].Error(), "stored state is unreadable") {
					t.Fatalf("stored %q: err %v, want the state named unreadable", bad, errs[0])
				}
				for i, err := range errs[1:] {
					if err != nil {
						t.Fatalf("stored %q under another key: request %d failed too: %v", bad, i+1, err)
					}
				}
			}
		})
	}
}
