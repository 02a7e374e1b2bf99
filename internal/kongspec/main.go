// Command kongspec reads the logs of a run of Kong's own busted specs
// against tollgate's drop-ins (make kong-spec: every spec twice, on Kong's
// plugins and on tollgate's) and fails when a test that passes on Kong's
// plugin does not pass on tollgate's, unless docs/kong.md lists it.
//
// docs/kong.md lists a known difference as a table row whose first cell
// is the spec file and line and whose second cell is a part of the
// test's name (may be empty), then the reason:
//
//	| 04-access_spec.lua @ 427 | [policy: cluster] | Kong's database ... |
//
// A test that failed on tollgate's side because its request reached a
// plugin server before the server listened (Kong 3.9.3 answers it 500 and
// logs "starting instance: no such file or directory") is run again on
// its own, by the runner given with -rerun, up to -attempts times: it
// passes when a run of it passes, and fails when a run of it fails for
// another reason or every run loses the same race.
//
// Usage: kongspec -logs DIR -specs "rl rrl ..." [-rerun run.sh] docs/kong.md
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	logs := flag.String("logs", "/tmp/kongspec/logs", "the run's logs: <side>-<spec>.log, busted -o gtest")
	specs := flag.String("specs", "", "the specs run, as run.sh names them (rl rrl rl-schema ...)")
	runner := flag.String("rerun", "", "the spec runner (run.sh) that runs again, on tollgate's side, a test that lost Kong's plugin-server start race; none: such a test fails")
	attempts := flag.Int("attempts", 12, "how many times -rerun runs such a test at most")
	flag.Parse()
	if flag.NArg() != 1 || *specs == "" {
		fmt.Fprintln(os.Stderr, "usage: kongspec -logs DIR -specs \"rl rrl ...\" [-rerun run.sh] docs/kong.md")
		os.Exit(2)
	}
	var again rerun
	if *runner != "" {
		again = rerun{attempts: *attempts, runs: new(int), run: runSpec(*runner, *logs)}
	}
	os.Exit(run(*logs, strings.Fields(*specs), flag.Arg(0), again, os.Stdout))
}

// startRace is what Kong 3.9.3 logs when a request reaches a Go plugin
// whose plugin server does not listen yet: Kong starts the server from a
// worker's timer and serves requests meanwhile, and a request that finds
// no socket is answered 500, with no retry
// (kong/runloop/plugin_servers/plugin.lua, get_instance_id). Kong's
// specs send their first request as soon as `kong start` returns, so
// some lose this race on a slow machine; Kong's Lua plugins have no
// server to wait for.
const startRace = "starting instance: no such file or directory"

// rerun runs one test of a spec again, on tollgate's side alone.
type rerun struct {
	attempts int
	runs     *int // runs so far, which name each run's log
	// run runs the tests of spec whose full names match the Lua pattern
	// filter and returns the path of their log, whose name ends in tag.
	run func(spec, filter, tag string, out io.Writer) (string, error)
}

// runSpec runs runner (Kong's spec runner) as rerun.run does, its
// output to out; the runner writes its logs to logs.
func runSpec(runner, logs string) func(spec, filter, tag string, out io.Writer) (string, error) {
	return func(spec, filter, tag string, out io.Writer) (string, error) {
		cmd := exec.Command("bash", runner)
		cmd.Env = append(os.Environ(), "KONGSPEC_SIDES=tollgate", "KONGSPEC_SPECS="+spec,
			"KONGSPEC_FILTER="+filter, "KONGSPEC_LOGTAG="+tag)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s %s: %w", runner, spec, err)
		}
		return filepath.Join(logs, "tollgate-"+spec+tag+".log"), nil
	}
}

// luaPattern is the Lua pattern (busted's --filter) that matches name
// and nothing else.
func luaPattern(name string) string {
	var b strings.Builder
	b.WriteByte('^')
	for _, r := range name {
		if !(r == ' ' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r > 127) {
			b.WriteByte('%')
		}
		b.WriteRune(r)
	}
	b.WriteByte('$')
	return b.String()
}

// settle runs a test that lost the start race again until a run of it
// passes (""), fails for another reason, or every attempt loses the race
// (what to report).
func (r rerun) settle(spec string, tg *specLog, name string, out io.Writer) string {
	for a := 1; a <= r.attempts; a++ {
		fmt.Fprintf(out, "kongspec: %s lost Kong's plugin-server start race; running it again (%d of %d)\n", name, a, r.attempts)
		*r.runs++
		path, err := r.run(spec, luaPattern(tg.full[name]), fmt.Sprintf("-rerun%d", *r.runs), out)
		if err != nil {
			return err.Error()
		}
		l, err := readLog(path)
		if err != nil {
			return err.Error()
		}
		switch {
		case l.outcome[name] == "OK":
			fmt.Fprintf(out, "kongspec: %s passes on its own after losing the start race\n", name)
			return ""
		case l.outcome[name] == "":
			return fmt.Sprintf("not run again (%s has no such test)", path)
		case !l.raced[name]:
			return fmt.Sprintf("%s again, not for the start race (%s)", l.outcome[name], path)
		}
	}
	return fmt.Sprintf("lost Kong's plugin-server start race in %d runs more", r.attempts)
}

// run checks every spec's two logs against the documented differences and
// returns the exit status. A test that lost Kong's plugin-server start
// race is run again by again, when it has a runner.
func run(logs string, specs []string, doc string, again rerun, out io.Writer) int {
	known, err := readKnown(doc)
	if err != nil {
		fmt.Fprintln(out, "kongspec:", err)
		return 2
	}
	used := make([]bool, len(known))
	var undocumented []string
	documented := 0
	for _, spec := range specs {
		base, err := readLog(filepath.Join(logs, "baseline-"+spec+".log"))
		if err != nil {
			fmt.Fprintln(out, "kongspec:", err)
			return 1
		}
		tg, err := readLog(filepath.Join(logs, "tollgate-"+spec+".log"))
		if err != nil {
			fmt.Fprintln(out, "kongspec:", err)
			return 1
		}
		for _, name := range base.order {
			if base.outcome[name] != "OK" || tg.outcome[name] == "OK" {
				continue
			}
			if i := match(known, name); i >= 0 {
				used[i] = true
				documented++
				continue
			}
			got := tg.outcome[name]
			if got == "" {
				got = "not run"
			}
			why := "passes on Kong's plugin"
			if tg.raced[name] {
				if again.run == nil {
					why += "; lost Kong's plugin-server start race, and -rerun is not given"
				} else if why2 := again.settle(spec, tg, name, out); why2 == "" {
					continue
				} else {
					why += "; " + why2
				}
			}
			undocumented = append(undocumented, fmt.Sprintf("%s: %s (%s)", got, name, why))
		}
	}
	for i, k := range known {
		if !used[i] {
			fmt.Fprintf(out, "kongspec: docs/kong.md lists %s @ %s %q, which no test of this run matched: it passes now, or its spec did not run\n", k.file, k.line, k.part)
		}
	}
	fmt.Fprintf(out, "kongspec: %d tests pass on Kong's plugin and not on tollgate's: %d listed in %s, %d not\n", documented+len(undocumented), documented, doc, len(undocumented))
	if len(undocumented) > 0 {
		sort.Strings(undocumented)
		for _, u := range undocumented {
			fmt.Fprintln(out, "kongspec:   "+u)
		}
		fmt.Fprintf(out, "kongspec: FAIL: fix them, or list each in %s's table of Kong's specs (spec file @ line, a part of the name, the reason)\n", doc)
		return 1
	}
	return 0
}

// knownDifference is a row of docs/kong.md's table of Kong's specs.
type knownDifference struct {
	file, line, part string
}

var knownRow = regexp.MustCompile(`^\|\s*(\S+_spec\.lua) @ (\d+)\s*\|([^|]*)\|`)

func readKnown(doc string) ([]knownDifference, error) {
	f, err := os.Open(doc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var known []knownDifference
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := knownRow.FindStringSubmatch(sc.Text()); m != nil {
			part := strings.TrimSpace(m[3])
			part = strings.TrimSuffix(strings.TrimPrefix(part, "`"), "`")
			known = append(known, knownDifference{file: m[1], line: m[2], part: part})
		}
	}
	return known, sc.Err()
}

// match returns the index of the row that lists the test name, or -1.
func match(known []knownDifference, name string) int {
	for i, k := range known {
		if strings.Contains(name, "/"+k.file+" @ "+k.line+": ") && strings.Contains(name, k.part) {
			return i
		}
	}
	return -1
}

// specLog is one side's outcomes: each test's OK, FAILED, ERROR or
// SKIPPED, by name with the plugin's name put back to Kong's; whether
// the test's output shows Kong's plugin-server start race (startRace);
// and its full name as busted knows it (after "spec_file.lua @ line: ").
type specLog struct {
	order   []string
	outcome map[string]string
	raced   map[string]bool
	full    map[string]string
}

var (
	outcomeLine = regexp.MustCompile(`^\[ *(OK|FAILED|ERROR|SKIPPED) *\] (.*) \([0-9.]+ ms\)$`)
	runLine     = regexp.MustCompile(`^\[ RUN +\] `)
	fullName    = regexp.MustCompile(`^\S+_spec\.lua @ \d+: (.*)$`)
)

// renamed puts Kong's plugin names back into a test's name, as the
// substitution took them out (in this order: the longer name first).
func renamed(name string) string {
	name = strings.ReplaceAll(name, "tollgate-response-ratelimiting", "response-ratelimiting")
	return strings.ReplaceAll(name, "Plugin: tollgate", "Plugin: rate-limiting")
}

func readLog(path string) (*specLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l := &specLog{outcome: map[string]string{}, raced: map[string]bool{}, full: map[string]string{}}
	seen := map[string]int{}
	complete, raced := false, false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "[==========] ") && strings.Contains(line, " ran.") {
			complete = true
		}
		if runLine.MatchString(line) {
			raced = false
			continue
		}
		m := outcomeLine.FindStringSubmatch(line)
		if m == nil {
			raced = raced || strings.Contains(line, startRace)
			continue
		}
		name := renamed(m[2])
		seen[name]++
		if seen[name] > 1 { // a name the spec's matrix repeats
			name = fmt.Sprintf("%s #%d", name, seen[name])
		}
		if f := fullName.FindStringSubmatch(m[2]); f != nil {
			l.full[name] = f[1]
		}
		if _, dup := l.outcome[name]; !dup {
			l.order = append(l.order, name)
		}
		l.outcome[name] = m[1]
		l.raced[name] = raced && m[1] != "OK"
		raced = false
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !complete {
		return nil, fmt.Errorf("%s: busted did not finish (no \"[==========] ... ran.\" line)", path)
	}
	return l, nil
}
