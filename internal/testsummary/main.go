// Command testsummary reads `go test -json` on standard input, prints each
// package's result and the output of every failed test as they come, and
// ends with a recap of each failed test's own lines (see recap) and one
// line "N passed, N failed, N skipped" counted over every test and subtest
// of every package. It exits 1 if anything failed,
// including a package that did not build or a go test that exited non-zero
// (reported by a last input line "go test exit <code>").
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	var passed, failed, skipped int
	var recaps []string
	broken := false
	// Output per running test, printed only if it fails.
	output := map[string]*strings.Builder{}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	for in.Scan() {
		line := in.Text()
		if code, ok := strings.CutPrefix(line, "go test exit "); ok {
			if code != "0" {
				broken = true
				fmt.Println("go test exited", code)
			}
			continue
		}
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
			fmt.Println(line) // not an event: a build error or a stray line
			continue
		}
		id := e.Package + " " + e.Test
		switch e.Action {
		case "output", "build-output":
			if e.Test == "" {
				if e.Action == "build-output" || strings.HasPrefix(e.Output, "FAIL") || strings.HasPrefix(e.Output, "panic") {
					fmt.Print(e.Output)
				}
				continue
			}
			b := output[id]
			if b == nil {
				b = &strings.Builder{}
				output[id] = b
			}
			b.WriteString(e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				if e.Action == "fail" {
					broken = true
				}
				fmt.Printf("%-4s %s %.1fs\n", map[string]string{"pass": "ok", "fail": "FAIL", "skip": "?"}[e.Action], e.Package, e.Elapsed)
				continue
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed++
				if b := output[id]; b != nil {
					fmt.Print(b.String())
					recaps = append(recaps, recap(e.Package+" "+e.Test, b.String())...)
				}
			case "skip":
				skipped++
			}
			delete(output, id)
		case "build-fail":
			broken = true
		}
	}
	if len(recaps) > 0 {
		fmt.Println("the failed tests' own lines again:")
		for _, l := range recaps {
			fmt.Println(l)
		}
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 || broken {
		os.Exit(1)
	}
}

// testLine is the first line of a t.Log or t.Error message: indented,
// then a test file's name and line.
var testLine = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: `)

// Recap limits: a CI log is often read from its end, where a failed
// test's whole output (a server's log it printed, say) has scrolled the
// assertion out of view; the recap brings back what the test itself said.
const (
	recapLines     = 40
	recapLineChars = 240
)

// recap returns, for a failed test's output, a header naming it and the
// first line of each message the test logged or failed with (at most
// recapLines, each cut to recapLineChars).
func recap(test, output string) []string {
	lines := []string{"--- FAIL: " + test}
	for _, l := range strings.Split(output, "\n") {
		if !testLine.MatchString(l) {
			continue
		}
		if len(lines) == recapLines+1 {
			lines = append(lines, "    …")
			break
		}
		if len(l) > recapLineChars {
			l = strings.ToValidUTF8(l[:recapLineChars], "") + "…" // a rune cut in two is dropped
		}
		lines = append(lines, l)
	}
	return lines
}
