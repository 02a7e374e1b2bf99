package caddymodule

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// FuzzCaddyfile feeds arbitrary text to the tollgate directive's parser: it
// must never panic, and whatever it accepts must provision or be refused
// with an error, never panic either.
func FuzzCaddyfile(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.caddyfile")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err == nil {
			f.Add(string(b))
		}
	}
	f.Add("tollgate {\n policy p {\n limit 10/1m token_bucket burst 5\n key {client_ip}\n }\n}")
	f.Add("tollgate {\n policy p {\n limit 1/1s leaky_bucket max_delay 1s\n cost 3\n shadow\n }\n headers none\n}")
	f.Add("tollgate {\n store redis redis://h:1 {\n mode eventual sync 50ms\n }\n policy p {\n limit 5/1d fixed_window\n }\n}")
	f.Fuzz(func(t *testing.T, src string) {
		tokens, err := caddyfile.Tokenize([]byte(src), "Caddyfile")
		if err != nil || len(tokens) == 0 {
			return
		}
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
			return
		}
		raw, err := json.Marshal(&h)
		if err != nil {
			t.Fatalf("accepted config does not marshal: %v", err)
		}
		var loaded Handler
		if err := json.Unmarshal(raw, &loaded); err != nil {
			t.Fatalf("accepted config does not round-trip: %v\n%s", err, raw)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		if err := loaded.Provision(ctx); err == nil {
			err = loaded.Validate()
		}
		_ = loaded.Cleanup()
	})
}
