// Command kongcompare measures tollgate inside real Kong (3.9, the kong on
// PATH; `make bench-kong` installs one as make kong-test does) beside
// Kong's own rate-limiting, with wrk, on the same Kong node: routes with no
// plugin, Kong's rate-limiting (local; redis), tollgate (local; redis) and
// tollgate-response (local), each allowed (limits never reached) and
// denied (one key over its limit). Routes run in rotating rounds (each
// round starts one route later), and for each route it prints the median
// req/s, p50 and p99, and the CPU µs per request of Kong's workers, the
// plugin servers and Redis (from /proc); on tollgate's redis route, how
// many requests each FCALL of its decide function carried and Redis's time
// per FCALL (INFO commandstats); then:
//
//	vs kong-rate-limiting allowed-local <f>
//	vs kong-rate-limiting allowed-redis <f>
//	vs kong-rate-limiting denied-local <f>
//	vs tollgate-allowed denied-local <f>
//	vs floor allowed-local <f>
//
// f is the median over rounds of the same round's ratio of requests/s
// (> 1: tollgate better), with the CPU model and Kong's worker count. The
// floor is a Go plugin making tollgate's two PDK calls and deciding
// nothing (kongplugin/internal/kongfloor); a last line gives the floor
// against Kong's rate-limiting, local: what the plugin protocol alone
// allows a Go plugin against Kong's own.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/kongreal"
	"github.com/tollgate/tollgate/internal/redistest"
)

// route is one contender: a path on the Kong node and the plugin on it.
type route struct {
	name   string
	path   string
	plugin map[string]any // nil: no plugin
	deny   bool           // one key over its limit: every request denied
}

// floorDir holds the floor plugin server's binary.
var floorDir string

// sample is one route's figures in one round.
type sample struct {
	rps, p50, p99         float64 // req/s, ms, ms
	kongUS, pluginUS, rUS float64 // CPU µs per request
	// Redis's FCALLs during the route's run (tollgate's decide function;
	// Kong's plugin sends none): requests per call, Redis's µs per call.
	perCall, callUS float64
}

// runner is the benchmark's testing.T stand-in for kongreal: it stops
// the program on a failure and runs cleanups at the end.
type runner struct{ cleanups []func() }

func (r *runner) Helper()                      {}
func (r *runner) Fatal(args ...any)            { r.stop(); log.Fatal(args...) }
func (r *runner) Fatalf(f string, args ...any) { r.stop(); log.Fatalf(f, args...) }
func (r *runner) Logf(f string, args ...any)   { log.Printf(f, args...) }
func (r *runner) Cleanup(f func())             { r.cleanups = append(r.cleanups, f) }
func (r *runner) Failed() bool                 { return false }
func (r *runner) TempDir() string {
	d, err := os.MkdirTemp("", "kongcompare")
	if err != nil {
		log.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (r *runner) stop() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func main() {
	rounds := flag.Int("rounds", 5, "rotating rounds")
	duration := flag.Duration("d", 3*time.Second, "wrk's duration per route and round")
	workers := flag.Int("workers", 2, "Kong's nginx_worker_processes")
	flag.Parse()
	if _, err := exec.LookPath("wrk"); err != nil {
		log.Fatal("wrk is missing: apt-get install wrk (make bench-kong installs it)")
	}
	if err := os.Chdir(".."); err != nil { // the repository root: kongreal builds the plugin servers from it
		log.Fatal(err)
	}
	r := &runner{}
	defer r.stop()
	r.Cleanup(kongreal.RemovePluginDir) // runs last: after Kong, which runs them, stopped
	up := kongreal.StartUpstream(r)
	rds, err := redistest.Start(r.TempDir())
	if err != nil {
		log.Fatal(err)
	}
	r.Cleanup(rds.Stop)
	redis := rds.KongRecord()
	// The floor: tollgate's plugin server deciding nothing (kongplugin/internal/kongfloor).
	floorDir = r.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(floorDir, "kongfloor"), "./kongplugin/internal/kongfloor").CombinedOutput(); err != nil {
		log.Fatalf("building the floor plugin: %v\n%s", err, out)
	}
	big := map[string]any{"minute": 1e9, "limit_by": "header", "header_name": "X-Key"}
	with := func(m map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	routes := []*route{
		{name: "no plugin", path: "/none"},
		{name: "kong rate-limiting, local", path: "/krl-local", plugin: map[string]any{"name": "rate-limiting", "config": big}},
		{name: "kong rate-limiting, redis", path: "/krl-redis", plugin: map[string]any{"name": "rate-limiting", "config": with(big, "policy", "redis", "redis", redis)}},
		{name: "tollgate, local", path: "/tg-local", plugin: map[string]any{"name": "tollgate", "config": big}},
		{name: "tollgate, redis", path: "/tg-redis", plugin: map[string]any{"name": "tollgate", "config": with(big, "policy", "redis", "redis", redis)}},
		{name: "tollgate-response, local", path: "/tgr-local", plugin: map[string]any{"name": "tollgate-response", "config": big}},
		{name: "kong rate-limiting, denying", path: "/krl-deny", deny: true, plugin: map[string]any{"name": "rate-limiting", "config": with(big, "minute", 1)}},
		{name: "tollgate, denying", path: "/tg-deny", deny: true, plugin: map[string]any{"name": "tollgate", "config": with(big, "minute", 1)}},
		{name: "floor: a Go plugin event, no PDK call", path: "/floor-event", plugin: map[string]any{"name": "kongfloor", "config": map[string]any{"no_calls": true}}},
		{name: "floor: the event and tollgate's 2 PDK calls", path: "/floor-calls", plugin: map[string]any{"name": "kongfloor", "config": map[string]any{}}},
	}
	d := kongreal.NewDeclarative("/probe-bench")
	for i, rt := range routes {
		route := map[string]any{"name": fmt.Sprintf("bench-%d", i), "paths": []string{rt.path}}
		if rt.plugin != nil {
			route["plugins"] = []any{rt.plugin}
		}
		d.AddService(map[string]any{"name": fmt.Sprintf("bench-%d", i), "url": up.URL, "routes": []any{route}})
	}
	file, err := json.Marshal(d)
	if err != nil {
		log.Fatal(err)
	}
	k := kongreal.Start(r, kongreal.Options{Declarative: string(file), Workers: *workers, Extra: []string{"log_level = notice", "proxy_access_log = off"},
		Servers: map[string]string{"kongfloor": filepath.Join(floorDir, "kongfloor")}})
	k.MustLoad(d)
	bin := kongreal.PluginDir(r)
	for _, rt := range routes {
		if rt.deny {
			k.Get(rt.path, "X-Key: flood") // the key's one request; the rest are denied
		}
	}
	samples := map[*route][]sample{}
	for round := 0; round < *rounds; round++ {
		for i := range routes {
			rt := routes[(i+round)%len(routes)]
			samples[rt] = append(samples[rt], measure(k, bin, rds, rt, *duration))
		}
	}
	model := "unknown"
	if out, err := exec.Command("lscpu").Output(); err == nil {
		if m := regexp.MustCompile(`(?m)^Model name:\s+(.+)$`).FindSubmatch(out); m != nil {
			model = string(m[1])
		}
	}
	fmt.Printf("Kong %s, %d workers, CPU %s, %d rounds of wrk -t2 -c16 -d%s per route\n\n", kongreal.Version(r), *workers, model, *rounds, *duration)
	fmt.Println("| route | req/s | p50 ms | p99 ms | CPU µs per request: Kong workers / plugin servers / Redis |")
	fmt.Println("| --- | --- | --- | --- | --- |")
	for _, rt := range routes {
		s := samples[rt]
		fmt.Printf("| %s | %.0f | %.2f | %.2f | %.0f / %.0f / %.0f |\n", rt.name, median(s, func(x sample) float64 { return x.rps }),
			median(s, func(x sample) float64 { return x.p50 }), median(s, func(x sample) float64 { return x.p99 }),
			median(s, func(x sample) float64 { return x.kongUS }), median(s, func(x sample) float64 { return x.pluginUS }),
			median(s, func(x sample) float64 { return x.rUS }))
	}
	tg := routes[4]
	fmt.Printf("\n%s: %.1f requests per FCALL of the decide function, %.0f µs of Redis's time per FCALL (INFO commandstats; medians)\n\n",
		tg.name, median(samples[tg], func(x sample) float64 { return x.perCall }), median(samples[tg], func(x sample) float64 { return x.callUS }))
	ratio := func(a, b *route) string {
		var rs []float64
		for i := range samples[a] {
			rs = append(rs, samples[a][i].rps/samples[b][i].rps)
		}
		sort.Float64s(rs)
		return fmt.Sprintf("%.2f (rounds %.2f to %.2f)", rs[len(rs)/2], rs[0], rs[len(rs)-1])
	}
	fmt.Printf("vs kong-rate-limiting allowed-local %s\n", ratio(routes[3], routes[1]))
	fmt.Printf("vs kong-rate-limiting allowed-redis %s\n", ratio(routes[4], routes[2]))
	fmt.Printf("vs kong-rate-limiting denied-local %s\n", ratio(routes[7], routes[6]))
	fmt.Printf("vs tollgate-allowed denied-local %s\n", ratio(routes[7], routes[3]))
	fmt.Printf("vs floor allowed-local %s\n", ratio(routes[3], routes[9]))
	fmt.Printf("the floor against kong-rate-limiting, local: %s\n", ratio(routes[9], routes[1]))
	cpuOf := func(rt *route) float64 {
		return median(samples[rt], func(x sample) float64 { return x.kongUS + x.pluginUS })
	}
	fmt.Printf("\nCPU per denial (Kong's workers and the plugin server): Kong's rate-limiting %.0f µs, tollgate %.0f µs; per allowed request tollgate %.0f µs\n",
		cpuOf(routes[6]), cpuOf(routes[7]), cpuOf(routes[3]))
	fmt.Printf("a Go plugin event costs %.0f µs of CPU (Kong's workers and the plugin server; the floor's event less no plugin), a PDK call %.0f µs (tollgate's 2 calls less the bare event, halved)\n",
		cpuOf(routes[8])-cpuOf(routes[0]), (cpuOf(routes[9])-cpuOf(routes[8]))/2)
}

// measure runs wrk on one route and reads the CPU its processes spent.
func measure(k *kongreal.Kong, bin string, rds *redistest.Server, rt *route, d time.Duration) sample {
	workers, plugins := k.Processes(bin)
	_, floor := k.Processes(floorDir)
	plugins = append(plugins, floor...)
	redisPid := rds.Pid()
	calls0, usec0, err := rds.CommandStats("fcall")
	if err != nil {
		log.Fatal(err)
	}
	before := [3]float64{cpu(workers), cpu(plugins), cpu([]int{redisPid})}
	out, err := exec.Command("wrk", "-t2", "-c16", "-d"+d.String(), "--latency", "-H", "X-Key: "+key(rt), k.ProxyURL+rt.path).CombinedOutput()
	if err != nil {
		log.Fatalf("wrk %s: %v\n%s", rt.path, err, out)
	}
	after := [3]float64{cpu(workers), cpu(plugins), cpu([]int{redisPid})}
	calls1, usec1, err := rds.CommandStats("fcall")
	if err != nil {
		log.Fatal(err)
	}
	total := wrkNumber(out, `(?m)^\s*(\d+) requests in`)
	if total == 0 {
		log.Fatalf("wrk %s made no request:\n%s", rt.path, out)
	}
	if rt.deny && !bytes.Contains(out, []byte("Non-2xx or 3xx responses: ")) {
		log.Fatalf("%s: no denial in wrk's run:\n%s", rt.path, out)
	}
	per := func(i int) float64 { return (after[i] - before[i]) * 1e6 / total }
	s := sample{rps: wrkNumber(out, `Requests/sec:\s+([\d.]+)`), p50: latency(out, "50%"), p99: latency(out, "99%"),
		kongUS: per(0), pluginUS: per(1), rUS: per(2)}
	if calls := calls1 - calls0; calls > 0 {
		s.perCall, s.callUS = total/float64(calls), float64(usec1-usec0)/float64(calls)
	}
	return s
}

// key is the X-Key a route's requests send: one key over its limit when
// denying, and allowed routes' limits are never reached.
func key(rt *route) string {
	if rt.deny {
		return "flood"
	}
	return "k-" + strings.TrimPrefix(rt.path, "/")
}

func wrkNumber(out []byte, re string) float64 {
	m := regexp.MustCompile(re).FindSubmatch(out)
	if m == nil {
		return 0
	}
	f, _ := strconv.ParseFloat(string(m[1]), 64)
	return f
}

// latency reads wrk's --latency line for a percentile, in ms.
func latency(out []byte, pct string) float64 {
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(pct) + `\s+([\d.]+)(us|ms|s)`).FindSubmatch(out)
	if m == nil {
		return 0
	}
	f, _ := strconv.ParseFloat(string(m[1]), 64)
	return f * map[string]float64{"us": 1e-3, "ms": 1, "s": 1e3}[string(m[2])]
}

// cpu is the CPU seconds (user and system) the processes have used.
func cpu(pids []int) float64 {
	var ticks float64
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		u, _ := strconv.ParseFloat(fields[11], 64) // utime: field 14 of stat
		s, _ := strconv.ParseFloat(fields[12], 64) // stime: field 15
		ticks += u + s
	}
	return ticks / 100 // USER_HZ
}

func median(s []sample, f func(sample) float64) float64 {
	var v []float64
	for _, x := range s {
		v = append(v, f(x))
	}
	sort.Float64s(v)
	return v[len(v)/2]
}
