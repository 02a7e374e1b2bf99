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
// Usage: kongspec -logs DIR -specs "rl rrl ..." docs/kong.md
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	logs := flag.String("logs", "/tmp/kongspec/logs", "the run's logs: <side>-<spec>.log, busted -o gtest")
	specs := flag.String("specs", "", "the specs run, as run.sh names them (rl rrl rl-schema ...)")
	flag.Parse()
	if flag.NArg() != 1 || *specs == "" {
		fmt.Fprintln(os.Stderr, "usage: kongspec -logs DIR -specs \"rl rrl ...\" docs/kong.md")
		os.Exit(2)
	}
	os.Exit(run(*logs, strings.Fields(*specs), flag.Arg(0), os.Stdout))
}

// run checks every spec's two logs against the documented differences and
// returns the exit status.
func run(logs string, specs []string, doc string, out io.Writer) int {
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
			undocumented = append(undocumented, fmt.Sprintf("%s: %s (passes on Kong's plugin)", got, name))
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
// SKIPPED, by name with the plugin's name put back to Kong's.
type specLog struct {
	order   []string
	outcome map[string]string
}

var outcomeLine = regexp.MustCompile(`^\[ *(OK|FAILED|ERROR|SKIPPED) *\] (.*) \([0-9.]+ ms\)$`)

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
	l := &specLog{outcome: map[string]string{}}
	seen := map[string]int{}
	complete := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "[==========] ") && strings.Contains(line, " ran.") {
			complete = true
		}
		m := outcomeLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name := renamed(m[2])
		seen[name]++
		if seen[name] > 1 { // a name the spec's matrix repeats
			name = fmt.Sprintf("%s #%d", name, seen[name])
		}
		if _, dup := l.outcome[name]; !dup {
			l.order = append(l.order, name)
		}
		l.outcome[name] = m[1]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !complete {
		return nil, fmt.Errorf("%s: busted did not finish (no \"[==========] ... ran.\" line)", path)
	}
	return l, nil
}
