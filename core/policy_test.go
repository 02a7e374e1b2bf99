package core

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/algo"
)

// TestCalendarWindowsHaveTheirOwnCounters: a calendar month and a 30-day
// window are two limits, never one counter.
func TestCalendarWindowsHaveTheirOwnCounters(t *testing.T) {
	both := MustPolicy("ids", PolicyOptions{}, algo.Limit{Count: 3, Window: algo.CalendarMonth, Algorithm: algo.FixedWindow}, algo.Limit{Count: 5, Window: 30 * 24 * time.Hour, Algorithm: algo.FixedWindow})
	if both.StoreSide().LimitID(0) == both.StoreSide().LimitID(1) {
		t.Errorf("a calendar month and a 30-day window share counters: both %q", both.StoreSide().LimitID(0))
	}
}

// TestPolicyErrorNamesTheLimit: a limit's error names its policy, its
// position and its rate.
func TestPolicyErrorNamesTheLimit(t *testing.T) {
	_, err := NewPolicy("api", PolicyOptions{}, algo.Limit{Count: 5, Window: time.Second}, algo.Limit{Count: 0, Window: time.Minute})
	if err == nil || err.Error() != `policy "api" limit 2 (0/1m): count: 0 must be at least 1` {
		t.Errorf("policy error: %v", err)
	}
}

// TestPolicyMethodsAreWhatUsersCall: a Policy is one policy, and its
// methods are what users read it with; what only a Store implementation
// needs goes on its StoreSide, and what a request may take instead of it
// (other plans, a reserve, the charging twin) on its Family, so this list
// grows only by a method a user calls on one policy.
func TestPolicyMethodsAreWhatUsersCall(t *testing.T) {
	users := []string{"Adaptive", "AfterResponse", "Configured", "HoldsLeases", "Limits", "Name",
		"NumLimits", "Plan", "PlanIndex", "Shadow", "ShowKey", "ShownName", "StoreSide"}
	var got []string
	typ := reflect.TypeFor[*Policy]()
	for i := range typ.NumMethod() {
		got = append(got, typ.Method(i).Name)
	}
	if !slices.Equal(got, users) {
		t.Errorf("Policy's methods are %v, want %v: a method only stores call belongs on StoreSide", got, users)
	}
	for _, m := range []string{"Apply", "ApplyLease", "ApplyCancel", "LimitMode", "LimitID", "LimitIDs",
		"Scope", "ScopeHash", "NameHash", "IdleMicros", "Penalty", "ChargesAfterResponse", "Policy"} {
		if _, ok := reflect.TypeFor[*StoreSide]().MethodByName(m); !ok {
			t.Errorf("StoreSide has no %s", m)
		}
	}
}
