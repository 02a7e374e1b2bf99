package command

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
)

func program(served *[]string) Program {
	schema := kongschema.MustParse([]byte(`{"fields": [{"config": {"type": "record", "fields": [{"a": {"type": "string"}}]}}]}`))
	forKong := kongschema.MustParse([]byte(`{"fields": [{"config": {"type": "record", "fields": [{"b": {"type": "string"}}]}}]}`))
	return Program{
		Schema: func() *kongschema.Schema { return schema },
		Info: kongschema.Info{Version: "1.2.3", Priority: 7, Phases: []string{"access"},
			ForKong: func(string) (*kongschema.Schema, error) { return forKong, nil }},
		Serve: func(prefix, name, socket string) error {
			*served = append(*served, prefix, name, socket)
			return os.ErrClosed
		},
		Keys: func(string, []byte) (keys.Target, error) { return keys.Target{}, nil },
	}
}

// TestMainReadsItsCommandLineOnce: version, -dump (the socket under
// -kong-prefix, the schema for that Kong when the prefix is given), a
// word it does not know refused with the usage before anything opens,
// and serving on <prefix>/<name>.socket.
func TestMainReadsItsCommandLineOnce(t *testing.T) {
	var served []string
	p := program(&served)
	name := executableName([]string{"x"})
	run := func(args ...string) (int, string, string) {
		var out, errs bytes.Buffer
		code := Main(append([]string{"x"}, args...), p, &out, &errs)
		return code, out.String(), errs.String()
	}
	if code, out, _ := run("version"); code != 0 || out != "1.2.3\n" {
		t.Errorf("version: %d %q", code, out)
	}
	for _, args := range [][]string{{"dump"}, {"-nope"}, {"serve", "now"}} {
		if code, _, errs := run(args...); code != 2 || !strings.Contains(errs, "usage:") {
			t.Errorf("%v: exit %d, want 2 with the usage: %s", args, code, errs)
		}
	}
	dump := func(args ...string) (socket string, fields string) {
		code, out, errs := run(args...)
		var d struct {
			SocketPath string
			Plugins    []struct {
				Name   string
				Schema json.RawMessage
			}
		}
		if code != 0 || json.Unmarshal([]byte(out), &d) != nil || len(d.Plugins) != 1 || d.Plugins[0].Name != name {
			t.Fatalf("%v: exit %d %s %s", args, code, out, errs)
		}
		return d.SocketPath, string(d.Plugins[0].Schema)
	}
	if socket, schema := dump("-dump"); socket != filepath.Join(DefaultKongPrefix, name+".socket") || !strings.Contains(schema, `"a"`) {
		t.Errorf("-dump: socket %s, schema %s", socket, schema)
	}
	if socket, schema := dump("-kong-prefix", "/k", "-dump"); socket != "/k/"+name+".socket" || !strings.Contains(schema, `"b"`) {
		t.Errorf("-dump for a Kong: socket %s, schema %s", socket, schema)
	}
	if len(served) != 0 {
		t.Fatalf("served while dumping or refusing: %v", served)
	}
	if code, _, errs := run("-kong-prefix", "/k"); code != 1 || !strings.Contains(errs, os.ErrClosed.Error()) {
		t.Errorf("serve: exit %d, %s", code, errs)
	}
	if want := []string{"/k", name, "/k/" + name + ".socket"}; strings.Join(served, " ") != strings.Join(want, " ") {
		t.Errorf("served %v, want %v", served, want)
	}
}

// TestCheckAndDumpTellKongsLog: a Kong whose workers run as nobody, with
// a typo in the start command, a query command without the prefix, a
// prefix nobody may not write and a .kong_env nobody may not read.
// `check` prints each finding with its fix and exits 1; -dump with the
// prefix (Kong's master runs it as root at every start) writes the same
// findings to Kong's error log at [error], once each, and still prints
// the schema alone on stdout.
func TestCheckAndDumpTellKongsLog(t *testing.T) {
	var served []string
	p := program(&served)
	name := executableName([]string{"x"})
	prefix := t.TempDir()
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Dir(prefix), prefix, filepath.Dir(bin)} { // nobody may pass, and run bin
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := "pluginserver_" + strings.ReplaceAll(name, "-", "_")
	env := "nginx_user = nobody nogroup\npluginserver_names = " + name + "\nproxy_error_log = logs/error.log\n" +
		key + "_start_cmd = " + bin + " serve -kong-prefix " + prefix + "\n" + key + "_query_cmd = " + bin + " -dump\n"
	if err := os.WriteFile(filepath.Join(prefix, ".kong_env"), []byte(env), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(prefix, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	errorLog := filepath.Join(prefix, "logs", "error.log")
	if err := os.WriteFile(errorLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	findings := []string{
		key + `_start_cmd = ` + bin + ` serve -kong-prefix ` + prefix + `: the server refuses its arguments: unknown subcommand or argument "serve"`,
		"fix: " + key + "_start_cmd = " + bin + " -kong-prefix " + prefix,
		key + "_query_cmd = " + bin + " -dump: without -dump -kong-prefix",
		"nobody may not create " + filepath.Join(prefix, name+".socket") + " (this plugin server's socket): " + prefix + " is drwxr-xr-x root:root",
		"fix: chgrp nogroup " + prefix + " && chmod g+ws " + prefix,
		"nobody may not read " + filepath.Join(prefix, ".kong_env") + " (-rw-r----- root:root",
	}

	var out, errs bytes.Buffer
	if code := Main([]string{"x", "check", "-kong-prefix", prefix}, p, &out, &errs); code != 1 {
		t.Fatalf("check: exit %d, want 1\n%s%s", code, out.String(), errs.String())
	}
	for _, want := range findings {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), "3 of 6 checks failed") || !strings.Contains(out.String(), "warn  nobody may not read") {
		t.Errorf("check's count:\n%s", out.String())
	}

	out.Reset()
	if code := Main([]string{"x", "-dump", "-kong-prefix", prefix}, p, &out, &errs); code != 0 || !json.Valid(out.Bytes()) {
		t.Fatalf("-dump: exit %d, stdout %q, stderr %q", code, out.String(), errs.String())
	}
	logged, _ := os.ReadFile(errorLog)
	lines := strings.Split(strings.TrimSpace(string(logged)), "\n")
	if len(lines) != 4 {
		t.Fatalf("Kong's error log: %d lines, want the 4 failures:\n%s", len(lines), logged)
	}
	for _, l := range lines {
		level := " [error] "
		if strings.Contains(l, "may not read") {
			level = " [warn] " // only policy cluster and Redis ssl_verify need it
		}
		if !strings.Contains(l, level) || !strings.Contains(l, "["+name+"] plugin server check: ") || !strings.HasSuffix(l, "("+name+" check -kong-prefix "+prefix+" shows every check)") {
			t.Errorf("not a line of Kong's log at [error]: %q", l)
		}
	}
	for _, want := range findings {
		if !strings.Contains(string(logged), want) {
			t.Errorf("Kong's error log lacks %q", want)
		}
	}
	if len(served) != 0 {
		t.Errorf("check or -dump served: %v", served)
	}
}

// TestCheckControlPlane: a hybrid control plane starts no plugin server,
// so nothing about sockets or start commands is checked there.
func TestCheckControlPlane(t *testing.T) {
	var served []string
	p := program(&served)
	prefix := t.TempDir()
	if err := os.WriteFile(filepath.Join(prefix, ".kong_env"), []byte("role = control_plane\nnginx_user = nobody nogroup\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code := Main([]string{"x", "check", "-kong-prefix", prefix}, p, &out, &errs); code != 0 || !strings.Contains(out.String(), "a hybrid control plane") {
		t.Fatalf("check on a control plane: exit %d\n%s%s", code, out.String(), errs.String())
	}
}
