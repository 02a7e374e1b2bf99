package keyname

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// A Decision names the hash, then each sliding_log and in_flight limit's
// sorted set as Limit names it, whatever the key's bytes and length, also
// when its memory last held another, longer or shorter key; each Arg
// writes its name as it is.
func TestDecisionNamesTheHashThenTheSortedSets(t *testing.T) {
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second, Algorithm: algo.SlidingLog},
		algo.Limit{Count: 2, Window: time.Minute}, algo.Limit{Count: 3, Window: time.Minute, Algorithm: algo.InFlight},
		algo.Limit{Count: 4, Window: time.Hour, Algorithm: algo.SlidingLog})
	var reused Decision
	for _, key := range []string{"client", "a}b{c%d", strings.Repeat("k", 300), "", "x", strings.Repeat("}", 70)} {
		hash := State("p:", p, key)
		want := []string{hash, Limit(hash, p, 0), Limit(hash, p, 2), Limit(hash, p, 3)}
		reused.Set("p:", p, key)
		if got := reused.Strings(); !slices.Equal(got, want) {
			t.Fatalf("key %.20q: a decision names %q, want %q", key, got, want)
		}
		for i := range reused.Len() {
			if b, _ := reused.Arg(i).MarshalBinary(); string(b) != want[i] {
				t.Fatalf("key %.20q: argument %d is sent as %q, want %q", key, i, b, want[i])
			}
		}
	}
}

// The hash's name is the whole "<policy>:<key>" inside one hash tag: a
// "}" or "%" in either is escaped, so a key can neither end the tag early
// nor share a name with another.
func TestStateEscapesTheHashTag(t *testing.T) {
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second})
	for key, want := range map[string]string{
		"client":        "p:{api:client}",
		"client}{weird": "p:{api:client%7D{weird}",
		"%7D":           "p:{api:%257D}",
		"}":             "p:{api:%7D}",
	} {
		if got := State("p:", p, key); got != want {
			t.Errorf("State(%q) = %q, want %q", key, got, want)
		}
	}
}
