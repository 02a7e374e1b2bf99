// Command caddycompare measures tollgate and mholt/caddy-ratelimit inside the
// same Caddy binary (bin/caddy-bench, built by `make bench-caddy`) with wrk,
// alternating contenders round by round, and prints the median requests/s
// and p99 latency of each, then one line per comparison:
//
//	vs <peer> <workload> <factor>
//
// with factor = tollgate's requests/s ÷ the peer's in the same round, the
// median over the rounds (> 1: tollgate faster), and each contender's
// CPU per request (its Caddy process's, read from /proc), whose excess
// over Caddy without a limiter is what a limiter costs a request. Each round starts one
// contender later than the one before, so no contender always runs just
// after the same one. One 4 s round's ratio moves by ±15% on this shared
// machine, hence 9 rounds.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// site is one contender: a Caddyfile site body serving "ok" behind a
// limiter, in a Caddy process of its own (so its memory can be read).
type site struct {
	name   string
	body   string // %d: the limit's count per second
	denied string // the body for the 1key-denied workload, if not body
	port   int
	pid    int
}

// floorHeaders are five headers of the sizes tollgate sends on an
// allowed request of the 100k-keys workload (sliding_counter, 100/1s).
const floorHeaders = `header RateLimit-Policy "\"p\";q=100;w=1"
	header RateLimit "\"p\";r=99;t=1"
	header X-RateLimit-Limit 100
	header X-RateLimit-Remaining 99
	header X-RateLimit-Reset 1
	`

var sites = []*site{
	{name: "no limiter", body: "respond ok"},
	// The fair floors: plain Caddy writing what tollgate writes, from
	// header directives: the five headers and "ok" when allowing; the
	// denial's six headers, 429 and body when denying.
	{name: "floor", body: floorHeaders + "respond ok", denied: `header RateLimit-Policy "\"p\";q=100;w=1"
	header RateLimit "\"p\";r=0;t=1"
	header X-RateLimit-Limit 100
	header X-RateLimit-Remaining 0
	header X-RateLimit-Reset 1
	header Retry-After 1
	header Content-Type "text/plain; charset=utf-8"
	respond "rate limit exceeded
" 429`},
	{name: "tollgate sliding_log", body: `tollgate {
		policy p {
			key {http.request.header.X-Key}
			limit %d/1s sliding_log
		}
	}
	respond ok`},
	{name: "tollgate sliding_counter", body: `tollgate {
		policy p {
			key {http.request.header.X-Key}
			limit %d/1s sliding_counter
		}
	}
	respond ok`},
	// The same decision without writing rate-limit headers: what the five
	// headers per response cost (caddy-ratelimit sends none when allowing).
	{name: "tollgate sliding_log nohdr", body: `tollgate {
		policy p {
			key {http.request.header.X-Key}
			limit %d/1s sliding_log
		}
		headers none
	}
	respond ok`},
	{name: "caddy-ratelimit", body: `rate_limit {
		zone p {
			key {http.request.header.X-Key}
			events %d
			window 1s
		}
	}
	respond ok`},
}

// workload is a key pattern and a limit.
type workload struct {
	name  string
	keys  int // distinct X-Key values, rotated per request
	limit int // per key per second
}

var workloads = []workload{
	// Every request allowed: the cost of deciding on many live keys.
	{name: "100k-keys-allowed", keys: 100000, limit: 100},
	// One key far over its limit: the cost of denying.
	{name: "1key-denied", keys: 1, limit: 100},
}

func main() {
	caddy := flag.String("caddy", "../bin/caddy-bench", "Caddy with tollgate and caddy-ratelimit")
	dur := flag.Duration("d", 4*time.Second, "wrk duration per measurement")
	conns := flag.Int("c", 64, "wrk connections")
	rounds := flag.Int("rounds", 9, "measurements per contender (median kept, and the median of the rounds' ratios)")
	only := flag.String("workload", "", "run only the workload with this name")
	flag.Parse()
	if _, err := exec.LookPath("wrk"); err != nil {
		log.Fatal("wrk not found: apt-get install -y wrk")
	}
	dir, err := os.MkdirTemp("", "caddycompare")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	fmt.Printf("wrk -t2 -c%d -d%s, %d rounds alternating (each starting one contender later), medians kept; Caddy and wrk share the machine\n\n", *conns, *dur, *rounds)
	fmt.Printf("%-18s %-26s %12s %10s %10s\n", "workload", "contender", "requests/s", "p99", "RSS")
	// result is one round of one contender: requests/s, p99 (s) and the
	// CPU its Caddy process spent per request (µs).
	type result struct{ rps, p99, cpu float64 }
	var lines []string
	for _, w := range workloads {
		if *only != "" && w.name != *only {
			continue
		}
		stop := startCaddy(*caddy, dir, w)
		script := filepath.Join(dir, "keys.lua")
		// Keys in a random order, as a gateway's clients arrive: not the
		// order a limiter first saw them in (which lays out per-key state
		// for the cache's prefetcher).
		must(os.WriteFile(script, []byte(fmt.Sprintf(`math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/", {["X-Key"] = "k" .. math.random(%d)})
end
`, w.keys)), 0o644))
		samples := map[string][]result{}
		for r := 0; r < *rounds; r++ {
			for i := range sites {
				s := sites[(i+r)%len(sites)]
				before := cpuSeconds(s.pid)
				rps, p99, requests := runWrk(s.port, script, *conns, *dur)
				cpu := (cpuSeconds(s.pid) - before) * 1e6 / requests
				samples[s.name] = append(samples[s.name], result{rps, p99, cpu})
			}
		}
		rss := map[string]float64{}
		for _, s := range sites {
			rss[s.name] = rssMB(s.pid)
		}
		stop()
		// byRound is a's requests/s over b's in each round; ratio is their
		// median: a slow spell between two rounds moves both.
		byRound := func(a, b string) []float64 {
			rs := make([]float64, *rounds)
			for r := range rs {
				rs[r] = samples[a][r].rps / samples[b][r].rps
			}
			return rs
		}
		ratio := func(a, b string) float64 {
			rs := byRound(a, b)
			sort.Float64s(rs)
			return rs[len(rs)/2]
		}
		med := map[string]result{}
		for _, s := range sites {
			rs := append([]result(nil), samples[s.name]...)
			sort.Slice(rs, func(i, j int) bool { return rs[i].rps < rs[j].rps })
			m := rs[len(rs)/2]
			med[s.name] = m
			fmt.Printf("%-18s %-26s %12.0f %9.2fms %8.1fMB\n", w.name, s.name, m.rps, m.p99*1000, rss[s.name])
		}
		base := rss["no limiter"]
		floorName := map[string]string{"100k-keys-allowed": "header-floor", "1key-denied": "respond-floor"}[w.name]
		for _, alg := range []string{"sliding_counter", "sliding_log"} {
			lines = append(lines, fmt.Sprintf("vs %s %s-%s %.2f", floorName, w.name, alg, ratio("tollgate "+alg, "floor")))
			var turns []string
			for _, q := range byRound("tollgate "+alg, "floor") {
				turns = append(turns, fmt.Sprintf("%.2f", q))
			}
			fmt.Printf("%-18s %-26s %s\n", w.name, "  "+alg+" ÷ floor by round", strings.Join(turns, " "))
		}
		lines = append(lines, fmt.Sprintf("vs plain-caddy %s-sliding_counter %.2f", w.name, ratio("tollgate sliding_counter", "no limiter")),
			fmt.Sprintf("vs plain-caddy %s-sliding_log %.2f", w.name, ratio("tollgate sliding_log", "no limiter")),
			fmt.Sprintf("vs caddy-ratelimit %s-sliding_counter-rss %.2f", w.name, rss["caddy-ratelimit"]/rss["tollgate sliding_counter"]),
			fmt.Sprintf("vs caddy-ratelimit %s-sliding_counter-rss-above-plain %.2f", w.name, (rss["caddy-ratelimit"]-base)/max(0.1, rss["tollgate sliding_counter"]-base)))
		// A limiter's own cost per request: the CPU its Caddy spent per
		// request minus the CPU Caddy without a limiter spent, each the
		// median over the rounds (µs). Unlike the time per request, it
		// does not move with what else the shared machine runs.
		medianCPU := func(name string) float64 {
			cpus := make([]float64, 0, *rounds)
			for _, r := range samples[name] {
				cpus = append(cpus, r.cpu)
			}
			sort.Float64s(cpus)
			return cpus[len(cpus)/2]
		}
		overhead := func(name string) float64 { return medianCPU(name) - medianCPU("no limiter") }
		peer := med["caddy-ratelimit"]
		for _, ours := range []string{"tollgate sliding_log", "tollgate sliding_counter", "tollgate sliding_log nohdr"} {
			alg := strings.ReplaceAll(strings.TrimPrefix(ours, "tollgate "), " ", "-")
			fmt.Printf("%-18s %-26s %9.2f µs of CPU/request over no limiter's %.2f (caddy-ratelimit %.2f)\n", w.name, ours, overhead(ours), medianCPU("no limiter"), overhead("caddy-ratelimit"))
			lines = append(lines,
				fmt.Sprintf("vs caddy-ratelimit %s-%s %.2f", w.name, alg, ratio(ours, "caddy-ratelimit")),
				fmt.Sprintf("vs caddy-ratelimit %s-%s-p99 %.2f", w.name, alg, peer.p99/med[ours].p99),
				fmt.Sprintf("vs caddy-ratelimit %s-%s-overhead %.2f", w.name, alg, overhead("caddy-ratelimit")/overhead(ours)))
		}
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Println(l)
	}
}

// startCaddy starts one Caddy per site for workload w.
func startCaddy(bin, dir string, w workload) (stop func()) {
	var cmds []*exec.Cmd
	for i, s := range sites {
		admin := freePort()
		s.port = freePort()
		body := s.body
		if s.denied != "" && w.name == "1key-denied" {
			body = s.denied
		}
		if strings.Contains(body, "%d") {
			body = fmt.Sprintf(body, w.limit)
		}
		cfg := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n\n:%d {\n\t%s\n}\n", admin, s.port, body)
		sdir := filepath.Join(dir, strconv.Itoa(i))
		must(os.MkdirAll(sdir, 0o755))
		path := filepath.Join(sdir, "Caddyfile")
		must(os.WriteFile(path, []byte(cfg), 0o644))
		cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
		logf, err := os.Create(filepath.Join(sdir, "caddy.log"))
		must(err)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Env = append(os.Environ(), "HOME="+sdir, "XDG_DATA_HOME="+sdir, "XDG_CONFIG_HOME="+sdir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		must(cmd.Start())
		s.pid = cmd.Process.Pid
		cmds = append(cmds, cmd)
		deadline := time.Now().Add(15 * time.Second)
		for {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/config/", admin))
			if err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(filepath.Join(sdir, "caddy.log"))
				log.Fatalf("caddy did not start: %s", b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}
}

// rssMB reads a process's resident set size in MB.
func rssMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

var (
	rpsRe   = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	p99Re   = regexp.MustCompile(`\n\s+99%\s+([0-9.]+)(us|ms|s)`)
	countRe = regexp.MustCompile(`(\d+) requests in`)
)

// cpuSeconds reads the user and system CPU a process has used (s).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	must(err)
	// The fields after the command's ")": state is the first, utime the
	// 12th and stime the 13th (proc(5)), in clock ticks of 1/100 s.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}

// runWrk loads port for dur and returns requests/s, p99 latency (s) and
// the requests answered.
func runWrk(port int, script string, conns int, dur time.Duration) (rps, p99, requests float64) {
	out, err := exec.Command("wrk", "-t2", "-c"+strconv.Itoa(conns), "-d"+dur.String(), "--latency", "-s", script,
		fmt.Sprintf("http://127.0.0.1:%d/", port)).CombinedOutput()
	if err != nil {
		log.Fatalf("wrk: %v\n%s", err, out)
	}
	m := rpsRe.FindSubmatch(out)
	l := p99Re.FindSubmatch(out)
	if m == nil || l == nil {
		log.Fatalf("cannot read wrk's output:\n%s", out)
	}
	rps, _ = strconv.ParseFloat(string(m[1]), 64)
	p99, _ = strconv.ParseFloat(string(l[1]), 64)
	n := countRe.FindSubmatch(out)
	if n == nil {
		log.Fatalf("cannot read wrk's output:\n%s", out)
	}
	requests, _ = strconv.ParseFloat(string(n[1]), 64)
	switch string(l[2]) {
	case "us":
		p99 /= 1e6
	case "ms":
		p99 /= 1e3
	}
	return rps, p99, requests
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
