package memory

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// rssBytes reads this process's resident set size from /proc.
func rssBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// TestHostileKeysStayUnderCap rotates distinct keys at full speed (300,000;
// 10 million with TOLLGATE_CHAOS=long, `make chaos`), some long (4 KB,
// hashed by the limiter) and some binary, through a store capped at 100,000
// keys: the heap stays near the cap's worth and no decision fails.
func TestHostileKeysStayUnderCap(t *testing.T) {
	n := 300_000 // 3 times the cap; make test runs it under -race
	if os.Getenv("TOLLGATE_CHAOS") == "long" {
		n = 10_000_000
	}
	const maxKeys = 100_000
	s := MustNew(Options{MaxKeys: maxKeys})
	lim := core.NewLimiter(core.MustPolicy("hostile", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.SlidingCounter}), s)
	long := strings.Repeat("x", 4096)
	binary := string([]byte{0, 0xff, 0xfe, '\n', 0x80})
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap, baseRSS := ms.HeapInuse, rssBytes(t)
	var peakHeap uint64
	peakRSS := baseRSS
	var d core.Decision
	began := time.Now()
	for i := 0; i < n; i++ {
		key := strconv.Itoa(i)
		switch i % 64 {
		case 0:
			key = long + key
		case 1:
			key = binary + key
		}
		if err := lim.Decide(context.Background(), key, 1, &d); err != nil || !d.Allowed {
			t.Fatalf("key %d: err %v allowed %v", i, err, d.Allowed)
		}
		if i%250_000 == 0 {
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
			peakRSS = max(peakRSS, rssBytes(t))
		}
	}
	growth := int64(peakHeap) - int64(baseHeap)
	t.Logf("%d distinct keys in %s, cap %d: tracking %d; heap growth at peak %.1f MB, RSS %.1f MB → peak %.1f MB",
		n, time.Since(began).Round(time.Millisecond), maxKeys, s.Len(), float64(growth)/1e6, float64(baseRSS)/1e6, float64(peakRSS)/1e6)
	if s.Len() > s.MaxKeys() {
		t.Fatalf("tracking %d keys, cap %d", s.Len(), s.MaxKeys())
	}
	// 150 bytes per key at the cap is 15 MB; allow for table growth and
	// garbage not yet collected.
	if growth > 64<<20 {
		t.Fatalf("heap grew %d MB under key rotation, want it bounded by the cap", growth>>20)
	}
}
