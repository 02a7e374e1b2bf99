package gate

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
)

// TestTopDeniedFindsHeavyHitters: 100,000 distinct keys denied once or
// twice each, among them 10 keys denied 200 to 2,000 times, in random
// order: the sketch holds k counters whatever the key count, and its top 10
// are the true top 10, each count at least the truth and within its error.
func TestTopDeniedFindsHeavyHitters(t *testing.T) {
	var stream []string
	truth := map[string]int64{}
	for i := 0; i < 100_000; i++ {
		k := "light-" + strconv.Itoa(i)
		n := 1 + i%2
		for j := 0; j < n; j++ {
			stream = append(stream, k)
		}
		truth[k] = int64(n)
	}
	for i := 0; i < 10; i++ {
		k := "heavy-" + strconv.Itoa(i)
		n := 200 * (i + 1)
		for j := 0; j < n; j++ {
			stream = append(stream, k)
		}
		truth[k] = int64(n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })

	const shown = 10 // 1,000 counters: one per hundred keys
	tk := newTopK(shown)
	now := time.Unix(0, 0)
	tk.nowFunc = func() time.Time { return now } // within one period: no decay
	for _, key := range stream {
		tk.offer(key)
	}
	if len(tk.heap) > shown*counterFactor || len(tk.index) != len(tk.heap) {
		t.Fatalf("%d counters (%d indexed) for %d shown", len(tk.heap), len(tk.index), shown)
	}
	top := tk.top()
	if len(top) != shown {
		t.Fatalf("top returned %d keys, want %d", len(top), shown)
	}
	for i := 0; i < 10; i++ {
		want := "heavy-" + strconv.Itoa(9-i)
		h := top[i]
		if h.Key != want || h.Count < truth[want] || h.Count-h.Error > truth[want] {
			t.Errorf("top %d: %+v, want %s (true count %d)", i, h, want, truth[want])
		}
	}
}

// TestTopDeniedFadesOut: counts halve every TopDeniedPeriod, so keys no
// longer denied leave the top within a few periods.
func TestTopDeniedFadesOut(t *testing.T) {
	tk := newTopK(10)
	now := time.Unix(0, 0)
	tk.nowFunc = func() time.Time { return now }
	for i := 0; i < 8; i++ {
		tk.offer("a")
	}
	tk.offer("b")
	now = now.Add(TopDeniedPeriod)
	if top := tk.top(); len(top) != 1 || top[0] != (Heavy{Key: "a", Count: 4}) {
		t.Fatalf("after one period: %+v, want a at 4 and b gone", top)
	}
	now = now.Add(3 * TopDeniedPeriod)
	if top := tk.top(); len(top) != 0 {
		t.Fatalf("after four periods: %+v, want nothing", top)
	}
}

func TestKeyHashIsStableAndShort(t *testing.T) {
	// printf %s sk_live_abc | sha256sum | cut -c1-12
	if got := core.KeyHash("sk_live_abc"); got != "b2817799acd7" {
		t.Fatalf("KeyHash: %q, want what sha256sum says", got)
	}
	if a1, a2 := core.KeyHash("a"), core.KeyHash("a"); core.KeyHash("a") == core.KeyHash("b") || a1 != a2 {
		t.Fatal("KeyHash is not a stable function of the key")
	}
}
