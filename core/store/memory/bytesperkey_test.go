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
// one-limit policy, 200,000 keys, after a collection) and holds
// docs/performance.md's figure to it, within a tenth: the figure is
// checked, not copied from an old run.
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

	const n = 200_000
	keys := make([]string, n) // made before the first reading: not the store's
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	s := MustNew(Options{MaxKeys: 2 * n})
	lim := core.NewLimiter(core.MustPolicy("perkey", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.TokenBucket}), s)
	var d core.Decision
	_ = lim.Decide(context.Background(), "warm", 1, &d)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, key := range keys {
		if err := lim.Decide(context.Background(), key, 1, &d); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	runtime.KeepAlive(keys)
	runtime.KeepAlive(s)
	t.Logf("%.0f bytes per tracked key (docs/performance.md: %d)", perKey, documented)
	if perKey < 0.9*float64(documented) || perKey > 1.1*float64(documented) {
		t.Errorf("a tracked key costs %.0f bytes of heap; docs/performance.md says %d: update the page", perKey, documented)
	}
}
