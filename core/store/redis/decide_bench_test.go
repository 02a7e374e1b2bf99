package redis

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// BenchmarkDecideBatched is Decide from 64 concurrent callers over 10,000
// keys under one GCRA limit that allows every request, on real Redis
// through the store's batches, as a busy gateway decides. ns/op is wall
// time per decision; allocs/op and B/op are this process's per decision,
// the lanes' included; client-cpu-µs/decision is this process's CPU time
// (user and system) per decision, which on a gateway's machine is taken
// from its requests.
func BenchmarkDecideBatched(b *testing.B) {
	const keys = 10_000
	s, err := New(Options{Settings: Settings{Addrs: []string{standalone.Addr}, Prefix: fmt.Sprintf("bdecide%d:", time.Now().UnixNano()),
		Username: standalone.User, Password: standalone.Password, Timeout: algo.Duration(10 * time.Second)}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	p := core.MustPolicy("bench", core.PolicyOptions{}, algo.Limit{Count: 1_000_000, Window: time.Second, Algorithm: algo.GCRA, Burst: 1_000_000})
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprint("client-", i)
	}
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	before := cpuSelf(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := next.Add(7919)
		var d core.Decision
		for pb.Next() {
			i++
			if err := s.Decide(ctx, p, names[i%keys], 1, &d); err != nil || !d.Allowed {
				b.Errorf("decision %v, allowed %v", err, d.Allowed)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpuSelf(b)-before).Microseconds())/float64(b.N), "client-cpu-µs/decision")
}

// cpuSelf is this process's user and system CPU time so far.
func cpuSelf(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
