package kongplugin_test

import (
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
)

// BenchmarkAccessOverSocket measures one access event through the real
// plugin server, as Kong sends it: the IPC cost Kong adds to a decision
// (HandleEvent, the PDK calls, the reply). It reports p50 and p99 latency;
// -cpu sets the number of concurrent connections.
func BenchmarkAccessOverSocket(b *testing.B) {
	rs, err := redistest.Start(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rs.Stop)
	for _, store := range []struct {
		name string
		cfg  map[string]any
	}{
		{"memory", map[string]any{"second": 1e9, "limit_by": "ip"}},
		{"redis", map[string]any{"second": 1e9, "limit_by": "ip", "policy": "redis", "redis": rs.KongRecord()}},
	} {
		b.Run(store.name+"/serial", func(b *testing.B) {
			srv := kongproc.Start(b)
			c := srv.Dial()
			defer c.Close()
			id, err := c.StartInstance(kongConfig(store.cfg))
			if err != nil {
				b.Fatal(err)
			}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				began := time.Now()
				if _, err := c.Access(id, kongproc.Request{ForwardedIP: "192.0.2." + strconv.Itoa(i%250)}); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(began))
			}
			b.StopTimer()
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
		b.Run(store.name+"/8-connections", func(b *testing.B) {
			srv := kongproc.Start(b)
			c := srv.Dial()
			id, err := c.StartInstance(kongConfig(store.cfg))
			c.Close()
			if err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(4) // 4 × GOMAXPROCS(2) connections
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				conn := srv.Dial()
				defer conn.Close()
				i := 0
				for pb.Next() {
					i++
					if _, err := conn.Access(id, kongproc.Request{ForwardedIP: "192.0.2." + strconv.Itoa(i%250)}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
