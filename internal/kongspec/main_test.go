package main

import (
	"io"
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
	if code := run(dir, []string{"rl"}, filepath.Join(dir, "listed.md"), rerun{}, &out); code != 0 {
		t.Errorf("the one difference listed: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run(dir, []string{"rl"}, filepath.Join(dir, "other.md"), rerun{}, &out); code != 1 || !strings.Contains(out.String(), "FAILED: spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 427: Plugin: rate-limiting [policy: cluster] blocks") {
		t.Errorf("a difference not listed: exit %d\n%s", code, out.String())
	}
	write("tollgate-rl.log", "[  FAILED  ] spec/03-plugins/23-rate-limiting/04-access_spec.lua @ 427: Plugin: tollgate [policy: cluster] blocks (1.00 ms)\n")
	out.Reset()
	if code := run(dir, []string{"rl"}, filepath.Join(dir, "listed.md"), rerun{}, &out); code != 1 || !strings.Contains(out.String(), "busted did not finish") {
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

// TestRerunsWhatLostTheStartRace: a tollgate failure whose output shows
// Kong's plugin-server start race is run again, alone, until a run of it
// passes; one that fails again for another reason, or loses the race in
// every run, fails the run, as does any other failure; without a runner,
// a raced test fails, saying so.
func TestRerunsWhatLostTheStartRace(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const (
		file = "spec/03-plugins/23-rate-limiting/05-integration_spec.lua @ 195: "
		end  = "[==========] 4 tests from 1 test file ran. (10.00 ms total)\n"
		race = "2026/11/29 20:31:02 [error] 5625#0: *2 [kong] plugin.lua:283 [tollgate] starting instance: no such file or directory, client: 127.0.0.1\n"
	)
	outcome := func(o, test string) string {
		return "[ " + o + " ] " + file + "Plugin: tollgate " + test + " (1.00 ms)\n"
	}
	started := func(test string) string { return "[ RUN      ] " + file + "Plugin: tollgate " + test + "\n" }
	write("baseline-rl-integration.log", strings.ReplaceAll(outcome("      OK", "wins later")+outcome("      OK", "fails later")+
		outcome("      OK", "never wins")+outcome("      OK", "plain failure")+end, "tollgate", "rate-limiting"))
	write("tollgate-rl-integration.log", started("wins later")+race+outcome(" FAILED ", "wins later")+
		started("fails later")+race+outcome(" FAILED ", "fails later")+
		started("never wins")+race+outcome(" FAILED ", "never wins")+
		started("plain failure")+outcome(" FAILED ", "plain failure")+end)
	write("doc.md", "")
	runs := map[string]int{}
	again := rerun{attempts: 3, runs: new(int), run: func(spec, filter, tag string, out io.Writer) (string, error) {
		test := strings.TrimSuffix(strings.TrimPrefix(filter, "^Plugin%: tollgate "), "$")
		runs[test]++
		body := started(test) + race + outcome(" FAILED ", test)
		switch {
		case test == "wins later" && runs[test] == 2:
			body = started(test) + outcome("      OK", test)
		case test == "fails later":
			body = started(test) + outcome(" FAILED ", test)
		}
		return write("tollgate-"+spec+tag+".log", body+end), nil
	}}
	var out strings.Builder
	code := run(dir, []string{"rl-integration"}, filepath.Join(dir, "doc.md"), again, &out)
	got := out.String()
	if code != 1 {
		t.Errorf("exit %d, want 1\n%s", code, got)
	}
	for _, want := range []string{
		"FAILED: " + file + "Plugin: rate-limiting fails later (passes on Kong's plugin; FAILED again, not for the start race",
		"FAILED: " + file + "Plugin: rate-limiting never wins (passes on Kong's plugin; lost Kong's plugin-server start race in 3 runs more)",
		"FAILED: " + file + "Plugin: rate-limiting plain failure (passes on Kong's plugin)",
		"wins later passes on its own after losing the start race",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "FAILED: "+file+"Plugin: rate-limiting wins later") {
		t.Errorf("a test that passed when run again fails the run:\n%s", got)
	}
	if runs["wins later"] != 2 || runs["fails later"] != 1 || runs["never wins"] != 3 || runs["plain failure"] != 0 {
		t.Errorf("runs again: %v, want wins later 2, fails later 1, never wins 3, plain failure 0", runs)
	}

	out.Reset()
	if code := run(dir, []string{"rl-integration"}, filepath.Join(dir, "doc.md"), rerun{}, &out); code != 1 ||
		!strings.Contains(out.String(), "wins later (passes on Kong's plugin; lost Kong's plugin-server start race, and -rerun is not given)") {
		t.Errorf("without a runner: exit %d\n%s", code, out.String())
	}
}

// TestLuaPatternMatchesTheNameAlone: every character Lua patterns give a
// meaning is escaped, and the pattern is anchored at both ends.
func TestLuaPatternMatchesTheNameAlone(t *testing.T) {
	got := luaPattern("Plugin: tollgate (integration) config.policy = redis #ssl_verify a-b [x]*+?^$%")
	want := "^Plugin%: tollgate %(integration%) config%.policy %= redis %#ssl%_verify a%-b %[x%]%*%+%?%^%$%%$"
	if got != want {
		t.Errorf("luaPattern = %q, want %q", got, want)
	}
}
