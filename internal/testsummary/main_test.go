package main

import (
	"strings"
	"testing"
)

// TestRecapKeepsTheTestsOwnLines: of a failed test's output, the recap
// keeps the first line of each message and drops what a message carried
// on further lines (a server's log), so the assertion stays in view.
func TestRecapKeepsTheTestsOwnLines(t *testing.T) {
	output := strings.Join([]string{
		"=== RUN   TestX",
		"    x_test.go:10: 300/s offered for 10s: goodput 0.93C",
		"    x_test.go:11: upstream once settled: p99 324ms; want p99 ≤ 3 × the unloaded 100ms",
		"    caddyproc.go:159: caddy log (last 3000 bytes):",
		`        {"level":"info","msg":"serving initial configuration"}`,
		"--- FAIL: TestX (13.68s)",
	}, "\n")
	got := recap("pkg TestX", output)
	want := []string{
		"--- FAIL: pkg TestX",
		"    x_test.go:10: 300/s offered for 10s: goodput 0.93C",
		"    x_test.go:11: upstream once settled: p99 324ms; want p99 ≤ 3 × the unloaded 100ms",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("recap:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRecapIsBounded: at most recapLines lines of at most recapLineChars
// bytes (and whole runes) each, then an ellipsis.
func TestRecapIsBounded(t *testing.T) {
	long := "    x_test.go:1: " + strings.Repeat("≥", recapLineChars)
	var lines []string
	for range recapLines + 5 {
		lines = append(lines, long)
	}
	got := recap("pkg TestY", strings.Join(lines, "\n"))
	if len(got) != recapLines+2 || got[len(got)-1] != "    …" {
		t.Fatalf("recap of %d lines gave %d, ending %q; want %d ending with an ellipsis", len(lines), len(got), got[len(got)-1], recapLines+2)
	}
	for _, l := range got[1 : len(got)-1] {
		if !strings.HasSuffix(l, "…") || len(l) > recapLineChars+len("…") || !strings.HasPrefix(l, long[:20]) {
			t.Fatalf("line %q: want the first %d bytes, whole runes, then …", l, recapLineChars)
		}
		if strings.ContainsRune(l, '\uFFFD') {
			t.Fatalf("line %q holds a rune cut in two", l)
		}
	}
}
