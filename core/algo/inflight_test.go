package algo

import (
	"testing"
	"time"
)

// TestInFlightLeases: at most Count held at once; ending a lease frees its
// slot at once; a renewed lease outlives its first Window; a lease nobody
// ends frees itself after Window; ending an expired or unknown lease finds
// nothing; a request of cost 2 holds two slots under one token.
func TestInFlightLeases(t *testing.T) {
	l := validated(t, Limit{Count: 2, Window: 10 * time.Second, Algorithm: InFlight})
	const sec = int64(time.Second / time.Microsecond)
	var s State
	var r Result
	s, r = Step(l, s, t0, 1) // lease A at t0
	s, r = Step(l, s, t0+sec, 1)
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("second lease: %+v", r)
	}
	s, r = Step(l, s, t0+2*sec, 1)
	if r.Allowed || r.RetryAfter != MaxInFlightRetry {
		t.Fatalf("third while two are held: %+v, want denied with RetryAfter %v", r, MaxInFlightRetry)
	}
	s, found := EndLease(l, s, t0+2*sec, t0, 1, false) // A's response finished
	if found != 1 {
		t.Fatalf("ending A found %d", found)
	}
	if s, r = Step(l, s, t0+2*sec, 1); !r.Allowed { // lease C at t0+2s
		t.Fatalf("after A ended: %+v", r)
	}
	if _, found = EndLease(l, s, t0+2*sec, t0, 1, false); found != 0 {
		t.Fatalf("A ended twice: found %d", found)
	}
	// B (taken at t0+1s) is renewed at t0+9s: it lives until t0+19s, while
	// C, never ended, expires at t0+12s.
	s, found = EndLease(l, s, t0+9*sec, t0+sec, 1, true)
	if found != 1 {
		t.Fatalf("renewing B found %d", found)
	}
	if _, r = Step(l, clone(s), t0+12*sec-1, 1); r.Allowed {
		t.Fatalf("C and B still held: %+v", r)
	}
	if _, r = Step(l, clone(s), t0+12*sec, 1); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("C expired, B renewed: %+v, want one slot", r)
	}
	if _, found = EndLease(l, clone(s), t0+12*sec, t0+2*sec, 1, false); found != 0 {
		t.Fatalf("ending expired C found %d", found)
	}
	if _, found = EndLease(l, clone(s), t0+12*sec, t0+9*sec, 1, false); found != 1 {
		t.Fatalf("ending renewed B by its new token found %d", found)
	}
	// Cost 2 holds both slots under one token; ending it frees both.
	var s2 State
	s2, _ = Step(l, s2, t0, 2)
	if _, r = Step(l, clone(s2), t0, 1); r.Allowed {
		t.Fatal("cost 2 left a slot")
	}
	if s2, found = EndLease(l, s2, t0+1, t0, 2, false); found != 2 {
		t.Fatalf("ending cost 2 found %d", found)
	}
	if _, r = Step(l, s2, t0+1, 2); !r.Allowed {
		t.Fatalf("both slots back: %+v", r)
	}
}
