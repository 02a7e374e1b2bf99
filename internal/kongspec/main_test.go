package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: a test that passes on Kong's plugin and fails on tollgate's
// fails the run unless the doc lists its spec file, line and a part of its
// name; tests that fail on Kong's plugin, or pass on both, never do; a log
// busted did not finish fails the run.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const end = "[==========] 3 tests from 1 test file ran. (10.00 ms total)\n"
	write("baseline-rl.log", "[       OK ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 427: Plugin: rate-limiting [policy: cluster] blocks (1.00 ms)\n"+
		"[       OK ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 505: Plugin: rate-limiting [policy: local] blocks (1.00 ms)\n"+
		"[  FAILED  ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 600: Plugin: rate-limiting flaky (1.00 ms)\n"+end)
	write("tollgate-rl.log", "[  FAILED  ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 427: Plugin: tollgate [policy: cluster] blocks (1.00 ms)\n"+
		"[       OK ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 505: Plugin: tollgate [policy: local] blocks (1.00 ms)\n"+
		"[  FAILED  ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 600: Plugin: tollgate flaky (1.00 ms)\n"+end)
	write("listed.md", "| 23-rate-limiting/04-access_spec.lua @ 427 | `[policy: cluster]` | not implemented |\n")
	write("other.md", "| 23-rate-limiting/04-access_spec.lua @ 427 | `[policy: local]` | a row for other tests |\n")
	var out strings.Builder
	if code := run(dir, []string{"rl"}, filepath.Join(dir, "listed.md"), &out); code != 0 {
		t.Errorf("the one difference listed: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run(dir, []string{"rl"}, filepath.Join(dir, "other.md"), &out); code != 1 || !strings.Contains(out.String(), "FAILED: spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 427: Plugin: rate-limiting [policy: cluster] blocks") {
		t.Errorf("a difference not listed: exit %d\n%s", code, out.String())
	}
	write("tollgate-rl.log", "[  FAILED  ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 427: Plugin: tollgate [policy: cluster] blocks (1.00 ms)\n")
	out.Reset()
	if code := run(dir, []string{"rl"}, filepath.Join(dir, "listed.md"), &out); code != 1 || !strings.Contains(out.String(), "busted did not finish") {
		t.Errorf("a log cut short: exit %d\n%s", code, out.String())
	}
}

// TestRenamedPutsKongsNamesBack: the response plugin's name is put back
// whole, not read as "Plugin: tollgate" followed by a suffix.
func TestRenamedPutsKongsNamesBack(t *testing.T) {
	for in, want := range map[string]string{
		"Plugin: tollgate-response-ratelimiting (shorthand fields)": "Plugin: response-ratelimiting (shorthand fields)",
		"Plugin: tollgate #db (access)":                             "Plugin: rate-limiting #db (access)",
	} {
		if got := renamed(in); got != want {
			t.Errorf("renamed(%q) = %q, want %q", in, got, want)
		}
	}
}
