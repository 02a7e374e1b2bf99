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
		Schema: schema,
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
