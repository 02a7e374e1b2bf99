// Command caddyinprocess measures what tollgate's Caddy handler and
// mholt/caddy-ratelimit each add to an allowed request, in process, where
// the over-HTTP comparison (caddycompare) cannot resolve it: Caddy spends
// 25-28 µs of CPU on a request over HTTP, and one round's figure moves by
// more than either limiter costs.
//
// Each contender is a Caddy handler chain ending in an empty handler,
// served Caddy-style requests (a clone with its own replacer and an X-Key
// header) over 100,000 keys asked in random order, every one allowed:
//   - no limiter: the empty handler alone;
//   - header floor: a handler that sets the five headers tollgate sends;
//   - tollgate sliding_log and tollgate sliding_counter, 100/1s per X-Key;
//   - caddy-ratelimit: a zone of 100 events per 1s window per X-Key (a
//     sliding log, tollgate's closest algorithm), sending no headers.
//
// Each measurement runs in a child process of its own (this command with
// -child), so one contender's heap and its collector's work (a ring of
// 100 times per key for caddy-ratelimit) land on its own figures, as they
// would on a Caddy running it: the child provisions the handler, shows it
// every key once (in another order than the one it is then asked in), then
// serves -n requests and reports its own CPU time (user and system, the
// collector's background workers included) per request. The contenders
// take turns for -rounds rounds, each round starting one contender later;
// a contender's figure is its median over the rounds. It prints, beside
// each figure, what a contender costs above no limiter, and
//
//	vs caddy-ratelimit 100k-keys-allowed-<algorithm>-in-process <factor>
//	vs caddy-ratelimit 100k-keys-allowed-<algorithm>-overhead-in-process <factor>
//	vs header-floor 100k-keys-allowed-<algorithm>-in-process <factor>
//
// factor = the peer's CPU per request ÷ tollgate's (the whole chain), and
// for -overhead the same for each one's excess over no limiter (> 1:
// tollgate costs less), from the medians. With -instructions it counts
// each contender's instructions per request instead (see instructions).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	caddyrl "github.com/mholt/caddy-ratelimit"

	"github.com/tollgate/tollgate/caddymodule"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/internal/benchkeys"
)

const keyCount = 100_000

// contenders are the handler chains measured, by name.
var contenders = []string{"no limiter", "header floor", "tollgate sliding_log", "tollgate sliding_counter", "caddy-ratelimit"}

// floorHeaders are the five headers tollgate sends an allowed request of
// 100/1s.
var floorHeaders = benchkeys.NewHeaderFloor(100, 1)

func main() {
	child := flag.String("child", "", "measure this contender alone and print its figures (used by the parent)")
	n := flag.Int("n", 400_000, "requests measured per contender and round")
	rounds := flag.Int("rounds", 7, "rounds: each runs every contender once, in a child process")
	counted := flag.Bool("instructions", false, "count instructions per request under valgrind's callgrind instead of timing")
	flag.Parse()
	if *child != "" {
		if err := measure(*child, *n); err != nil {
			log.Fatal(err)
		}
		return
	}
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	if *counted {
		if err := instructions(self); err != nil {
			log.Fatal(err)
		}
		return
	}
	type figures struct{ cpu, wall []float64 }
	got := map[string]*figures{}
	for _, c := range contenders {
		got[c] = &figures{}
	}
	fmt.Printf("%d keys asked in random order, all allowed; %d requests per contender and round, %d rounds, each contender in a process of its own\n\n",
		keyCount, *n, *rounds)
	for r := 0; r < *rounds; r++ {
		for i := range contenders {
			c := contenders[(i+r)%len(contenders)]
			cmd := exec.Command(self, "-child", c, "-n", strconv.Itoa(*n))
			var stderr strings.Builder
			cmd.Stderr = &stderr // Caddy's log: shown only on failure
			out, err := cmd.Output()
			if err != nil {
				log.Fatalf("%s: %v\n%s%s", c, err, out, stderr.String())
			}
			var cpu, wall float64
			if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "%g %g", &cpu, &wall); err != nil {
				log.Fatalf("%s: %q: %v", c, out, err)
			}
			got[c].cpu, got[c].wall = append(got[c].cpu, cpu), append(got[c].wall, wall)
		}
	}
	med := map[string]float64{}
	fmt.Printf("%-26s %18s %18s %22s\n", "contender", "CPU ns/request", "wall ns/request", "CPU ns over no limiter")
	for _, c := range contenders {
		med[c] = median(got[c].cpu)
		fmt.Printf("%-26s %18.0f %18.0f %22.0f   (CPU by round: %s)\n", c, med[c], median(got[c].wall), med[c]-med["no limiter"], join(got[c].cpu))
	}
	fmt.Println()
	peer, none, floor := med["caddy-ratelimit"], med["no limiter"], med["header floor"]
	for _, alg := range []string{"sliding_log", "sliding_counter"} {
		ours := med["tollgate "+alg]
		fmt.Printf("vs caddy-ratelimit 100k-keys-allowed-%s-in-process %.2f\n", alg, peer/ours)
		fmt.Printf("vs caddy-ratelimit 100k-keys-allowed-%s-overhead-in-process %.2f\n", alg, (peer-none)/(ours-none))
		fmt.Printf("vs header-floor 100k-keys-allowed-%s-in-process %.2f\n", alg, floor/ours)
	}
}

// measure provisions contender c, shows it every key once, serves n
// requests over the keys in random order and prints its CPU and wall
// time per request, in ns.
func measure(c string, n int) error {
	// A loaded config with no app, so handlers find the apps they ask for
	// (caddy-ratelimit asks for the events app); not saved to disk.
	if err := caddy.Load([]byte(`{"admin":{"disabled":true,"config":{"persist":false}}}`), false); err != nil {
		return err
	}
	defer func() { _ = caddy.Stop() }()
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	defer cancel()
	handle, stop, err := handler(ctx, c)
	if err != nil {
		return err
	}
	defer stop()
	asked, firstSeen := benchkeys.Orders(keyCount)
	if err := serve(handle, firstSeen, len(firstSeen)); err != nil {
		return err
	}
	var before, after syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		return err
	}
	began := time.Now()
	if err := serve(handle, asked, n); err != nil {
		return err
	}
	wall := time.Since(began)
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &after); err != nil {
		return err
	}
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	fmt.Printf("%.1f %.1f\n", float64(cpu.Nanoseconds())/float64(n), float64(wall.Nanoseconds())/float64(n))
	return nil
}

// handler returns contender c's chain, provisioned in ctx, and what stops
// it: tollgate's Cleanup, as Caddy calls it when a config is unloaded
// (caddy-ratelimit's sweeper ends with ctx).
func handler(ctx caddy.Context, c string) (handle caddyhttp.HandlerFunc, stop func(), err error) {
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	nothing := func() {}
	switch c {
	case "no limiter":
		return next, nothing, nil
	case "header floor":
		return func(w http.ResponseWriter, r *http.Request) error {
			floorHeaders.Set(w.Header())
			return next(w, r)
		}, nothing, nil
	case "tollgate sliding_log", "tollgate sliding_counter":
		h := &caddymodule.Handler{Policies: []*caddymodule.PolicyConfig{{Policy: config.Policy{Name: "p", Key: "{http.request.header.X-Key}",
			Limits: []config.Limit{{Count: 100, Window: algo.Duration(time.Second), Algorithm: strings.TrimPrefix(c, "tollgate ")}}}}}}
		if err := h.Provision(ctx); err != nil {
			return nil, nil, err
		}
		return func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, next) }, func() { _ = h.Cleanup() }, nil
	case "caddy-ratelimit":
		h := &caddyrl.Handler{RateLimits: map[string]*caddyrl.RateLimit{"p": {Key: "{http.request.header.X-Key}", MaxEvents: 100, Window: caddy.Duration(time.Second)}}}
		if err := h.Provision(ctx); err != nil {
			return nil, nil, err
		}
		return func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, next) }, nothing, nil
	}
	return nil, nil, fmt.Errorf("no contender %q", c)
}

// serve serves n requests through handle the way Caddy calls a handler: a
// fresh request with its own replacer, keyed by X-Key over keys in turn.
// A request the limiter refused (not passed to the empty handler at the
// chain's end, so the recorder's status is set) fails the measurement.
func serve(handle caddyhttp.HandlerFunc, keys []string, n int) error {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	for i := 0; i < n; i++ {
		r := req.Clone(req.Context())
		r.Header = http.Header{"X-Key": {keys[i%len(keys)]}}
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
		clear(w.Header())
		if err := handle(w, r); err != nil {
			return fmt.Errorf("request %d: %v", i, err)
		}
		if w.Code != http.StatusOK || w.Header().Get("Retry-After") != "" {
			return fmt.Errorf("request %d (key %s) was refused", i, keys[i%len(keys)])
		}
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func join(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.FormatFloat(x, 'f', 0, 64))
	}
	return strings.Join(s, " ")
}
