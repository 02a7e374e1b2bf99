package memory

import (
	"context"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// TestBytesPerKeyAsDocumented measures the heap a tracked key costs (a
// one-limit policy, 200,000 keys, after a collection), and a sliding
// log's besides its ring, and holds docs/performance.md's figures to
// them, within a tenth: the figures are checked, not copied from an old
// run.
func TestBytesPerKeyAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`Memory per tracked key is (\d+) bytes`).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/performance.md: no "Memory per tracked key is N bytes"`)
	}
	documented, _ := strconv.Atoi(string(m[1]))
	perKey := bytesPerKey(algo.TokenBucket)
	t.Logf("%.0f bytes per tracked key (docs/performance.md: %d)", perKey, documented)
	if perKey < 0.9*float64(documented) || perKey > 1.1*float64(documented) {
		t.Errorf("a tracked key costs %.0f bytes of heap; docs/performance.md says %d: update the page", perKey, documented)
	}

	// A sliding log's key, its ring of 4 slots (one request held) apart.
	m = regexp.MustCompile(`about (\d+)\s+bytes a key plus 8 per slot of its ring`).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/performance.md: no "about N bytes a key plus 8 per slot of its ring"`)
	}
	documented, _ = strconv.Atoi(string(m[1]))
	perKey = bytesPerKey(algo.SlidingLog) - 4*8
	t.Logf("%.0f bytes per sliding log key besides its ring (docs/performance.md: %d)", perKey, documented)
	if perKey < 0.9*float64(documented) || perKey > 1.1*float64(documented) {
		t.Errorf("a sliding log's key costs %.0f bytes of heap besides its ring; docs/performance.md says %d: update the page", perKey, documented)
	}
}

// bytesPerKey returns the heap a tracked key of a one-limit policy of alg
// costs, with one request held: 200,000 keys, after a collection.
func bytesPerKey(alg algo.Algorithm) float64 {
	const n = 200_000
	keys := make([]string, n) // made before the first reading: not the store's
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	s := MustNew(Options{MaxKeys: 2 * n})
	lim := core.NewLimiter(core.MustPolicy("perkey", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: alg}), s)
	var d core.Decision
	_ = lim.Decide(context.Background(), "warm", 1, &d)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, key := range keys {
		_ = lim.Decide(context.Background(), key, 1, &d) // the memory store never fails
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(keys)
	runtime.KeepAlive(s)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
}
