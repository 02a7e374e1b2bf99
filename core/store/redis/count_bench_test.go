package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// BenchmarkEventualSync is one eventual-mode sync of 1,000 busy windows
// (AddCounts: one count.lua each, in one pipeline) against real Redis,
// beside the floor of what a sync must send: the same windows' INCRBY and
// PEXPIRE, pipelined as plain commands (which cannot keep an expiry from
// moving earlier). Each iteration times both, alternately, and one line
// compares them: `vs INCRBY+PEXPIRE-pipeline sync-1000-windows F`, F > 1
// when the script is cheaper (run it with -benchtime 200x, as make
// bench-core does, for that one line).
func BenchmarkEventualSync(b *testing.B) {
	const windows = 1000
	ctx := context.Background()
	prefix := fmt.Sprintf("bsync%d:", time.Now().UnixNano())
	s, err := New(Options{Settings: Settings{Addrs: []string{standalone.Addr}, Prefix: prefix,
		Username: standalone.User, Password: standalone.Password, Timeout: algo.Duration(10 * time.Second)}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	floor := goredis.NewClient(&goredis.Options{Addr: standalone.Addr, Username: standalone.User, Password: standalone.Password})
	defer floor.Close()
	p := core.MustPolicy("sync", core.PolicyOptions{}, algo.Limit{Count: 1000, Window: time.Minute, Algorithm: algo.FixedWindow})
	counts := make([]core.SharedCount, windows)
	floorKeys := make([]string, windows)
	for i := range counts {
		counts[i] = core.SharedCount{Policy: p, Key: fmt.Sprint("client-", i), Start: 60_000_000, Add: 1,
			Keep: time.Minute, KeepNew: time.Minute}
		floorKeys[i] = s.countKey(&counts[i]) + ":floor"
	}
	var ours, theirs time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := s.AddCounts(ctx, counts); err != nil {
			b.Fatal(err)
		}
		ours += time.Since(start)
		start = time.Now()
		if _, err := floor.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
			for _, k := range floorKeys {
				pipe.IncrBy(ctx, k, 1)
				pipe.PExpire(ctx, k, time.Minute)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		theirs += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(ours.Nanoseconds())/float64(b.N*windows), "ns/window")
	b.ReportMetric(float64(theirs.Nanoseconds())/float64(b.N*windows), "floor-ns/window")
	if b.N > 1 { // not the probe run that sizes b.N (-benchtime 200x: one line)
		b.Logf("vs INCRBY+PEXPIRE-pipeline sync-1000-windows %.2f", float64(theirs)/float64(ours))
	}
}
