package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// TestHostileKeysBoundedInRedis sends rotating keys, some 1 MB long and some
// binary, through the Redis store: no error, every Redis key stays short
// (long request keys are hashed), and idle keys expire, so the key count
// falls back to zero.
func TestHostileKeysBoundedInRedis(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	lim := core.NewLimiter(core.MustPolicy("hostile", core.PolicyOptions{},
		algo.Limit{Count: 5, Window: time.Second, Algorithm: algo.SlidingLog},
		algo.Limit{Count: 50, Window: time.Second, Algorithm: algo.FixedWindow}), s)
	huge := strings.Repeat("k", 1<<20)
	binary := string([]byte{0, 0xff, '\r', '\n', '{', '}'})
	var d core.Decision
	for i := 0; i < 2000; i++ {
		key := "ip-" + strconv.Itoa(i)
		switch i % 10 {
		case 0:
			key = huge + key
		case 1:
			key = binary + key
		}
		if err := lim.Decide(context.Background(), key, 1, &d); err != nil || !d.Allowed {
			t.Fatalf("key %d: err %v allowed %v", i, err, d.Allowed)
		}
	}
	admin := adminClient(t) // KEYS is the test's, not tollgate's (TOLLGATE_REDIS_ACL)
	keys, err := admin.Keys(context.Background(), s.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	longest := 0
	for _, k := range keys {
		longest = max(longest, len(k))
	}
	t.Logf("2000 request keys (200 of 1 MB): %d Redis keys, longest %d bytes", len(keys), longest)
	if longest > len(s.prefix)+core.MaxKeyLen+64 {
		t.Fatalf("a Redis key is %d bytes long: request keys are not bounded", longest)
	}
	waitfor.TrueEvery(t, 5*time.Second, 50*time.Millisecond, "idle keys expire after their 1 s windows", func() bool {
		keys, _ = admin.Keys(context.Background(), s.prefix+"*").Result()
		return len(keys) == 0
	})
	if len(keys) > 0 {
		t.Fatalf("%d keys still in Redis 5 s after their 1 s windows: idle keys do not expire", len(keys))
	}
}
