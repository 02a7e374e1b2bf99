package kongplugin_test

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
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

// BenchmarkVsFloor measures the access event of an allowed request (limit
// by IP, memory store) through tollgate's plugin server and through the
// floor plugin server (kongplugin/internal/kongfloor: the same plugin server and the
// same PDK calls, no decision), one connection each, in five alternating
// rounds of 2,000 events. It prints both p50s and p99s and `vs
// floor-plugin kong-access-p50 <floor p50 ÷ tollgate p50>` (> 1 would mean
// tollgate is faster than the floor). make bench runs it.
func BenchmarkVsFloor(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	names := []string{"floor", "tollgate"}
	servers := []*kongproc.Server{kongproc.StartPackage(b, "github.com/tollgate/tollgate/kongplugin/internal/kongfloor"), kongproc.Start(b)}
	clients := make([]*kongproc.Client, len(servers))
	ids := make([]int32, len(servers))
	calls := make([][]string, len(servers))
	for i, s := range servers {
		clients[i] = s.Dial()
		defer clients[i].Close()
		var err error
		if ids[i], err = clients[i].StartInstance(kongConfig(map[string]any{"second": 1e9, "limit_by": "ip"})); err != nil {
			b.Fatal(err)
		}
		res, err := clients[i].Access(ids[i], kongproc.Request{ForwardedIP: "192.0.2.1"})
		if err != nil {
			b.Fatal(err)
		}
		calls[i] = res.Calls
	}
	if strings.Join(calls[0], " ") != strings.Join(calls[1], " ") {
		b.Fatalf("the floor makes PDK calls %v, tollgate %v: not the same", calls[0], calls[1])
	}
	took := make([][]time.Duration, len(servers))
	for round := 0; round < 5; round++ {
		for i, c := range clients {
			for n := 0; n < 2000; n++ {
				began := time.Now()
				if _, err := c.Access(ids[i], kongproc.Request{ForwardedIP: "192.0.2." + strconv.Itoa(n%250)}); err != nil {
					b.Fatal(err)
				}
				took[i] = append(took[i], time.Since(began))
			}
		}
	}
	var p50 [2]time.Duration
	for i, t := range took {
		slices.Sort(t)
		p50[i] = t[len(t)/2]
		fmt.Printf("%-8s p50 %v p99 %v (PDK calls: %s)\n", names[i], p50[i], t[len(t)*99/100], strings.Join(calls[i], ", "))
	}
	fmt.Printf("vs floor-plugin kong-access-p50 %.2f (tollgate %.2f× the floor's p50)\n", float64(p50[0])/float64(p50[1]), float64(p50[1])/float64(p50[0]))
}

// BenchmarkStartToSocket measures how long after the plugin server's
// process starts its socket accepts a connection (Kong answers 500 to a
// request that reaches the plugin before that): started as Kong starts it
// (-kong-prefix DIR, so the socket opens while the packages initialize),
// and with the flag given twice, a command line that serves the same but
// that earlysocket leaves alone, so the socket opens in main. Five
// alternating rounds of 20 starts each; it prints both medians and `vs
// socket-in-main plugin-server-start-to-accept <main's ÷ ours>`.
func BenchmarkStartToSocket(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	bin := kongproc.Binary(b)
	socketAfter := func(twice bool) time.Duration {
		prefix := b.TempDir()
		args := []string{"-kong-prefix", prefix}
		if twice {
			args = append(args, args...)
		}
		cmd := exec.Command(bin, args...)
		began := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		socket := filepath.Join(prefix, filepath.Base(bin)+".socket")
		for deadline := began.Add(10 * time.Second); ; {
			if c, err := net.Dial("unix", socket); err == nil {
				took := time.Since(began)
				c.Close()
				return took
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s %v: no socket after 10 s", bin, args)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	var early, inMain []time.Duration
	for round := 0; round < 5; round++ {
		for n := 0; n < 20; n++ {
			early = append(early, socketAfter(false))
		}
		for n := 0; n < 20; n++ {
			inMain = append(inMain, socketAfter(true))
		}
	}
	slices.Sort(early)
	slices.Sort(inMain)
	fmt.Printf("start to accept: socket opened while initializing %v (median of %d), in main %v\n", early[len(early)/2], len(early), inMain[len(inMain)/2])
	fmt.Printf("vs socket-in-main plugin-server-start-to-accept %.2f\n", float64(inMain[len(inMain)/2])/float64(early[len(early)/2]))
}
