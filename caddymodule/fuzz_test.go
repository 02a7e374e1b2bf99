package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
			_ = loaded.Validate() // an accepted config may still be refused here; neither may panic
		}
		_ = loaded.Cleanup()
	})
}

// FuzzCaddyJSON feeds arbitrary JSON to the handler as Caddy loads it
// (unmarshal, Provision, Validate, Cleanup): it never panics, and a refusal
// says why.
func FuzzCaddyJSON(f *testing.F) {
	for _, seed := range []string{
		`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`,
		`{"policies":[{"name":"a","key":"{http.request.header.X-Key}","limits":[{"count":5,"window":"1m","algorithm":"gcra","burst":2}]}],"headers":"ietf","jitter":0.5}`,
		`{"store":{"type":"redis","url":"redis://127.0.0.1:1","on_error":"local"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`,
		`{"policies":[{"name":"a","plan":"{plan}","plans":[{"name":"free","limits":[{"count":5,"window":"1m"}]}],"default_plan":"free"}]}`,
		`{"policies":[{"name":"a","adaptive":{"min":0.2},"limits":[{"count":5,"window":"1s","algorithm":"gcra"}]}]}`,
		`{"policies":[null]}`, `{"policies":[{"name":"a","limits":[null]}]}`, `null`, `{"store":null}`,
		`{"policies":[{"name":"a","key":"{","limits":[{"count":5,"window":"1m"}]}]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var h Handler
		if err := json.Unmarshal([]byte(raw), &h); err != nil {
			return
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		err := h.Provision(ctx)
		if err == nil {
			err = h.Validate()
		}
		if err != nil && err.Error() == "" {
			t.Fatalf("refused %s without a reason", raw)
		}
		_ = h.Cleanup()
	})
}

// FuzzKeyTemplate feeds arbitrary text to the key template parser: it never
// panics, an accepted template fills without panicking, and a template
// without placeholders is its own key (escaped braces unescaped).
func FuzzKeyTemplate(f *testing.F) {
	for _, seed := range []string{
		"{http.request.header.X-Key}", "k-{http.request.uri.query.token}:{http.vars.client_ip}", "\\{lit\\}", "{", "}", "{}",
		"{http.request.heder.X}", "{plan}", "{http.request.remote.host/24}", "a{http.request.method}b{env.HOME}c",
	} {
		f.Add(seed, "X-Key", "token=a&token=b")
	}
	f.Fuzz(func(t *testing.T, template, header, query string) {
		k, err := parseKeyTemplate(template)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("refused %q without a reason", template)
			}
			return
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.URL.RawQuery = query
		r.Header["X-Key"] = []string{header, "second"}
		repl := caddyhttp.NewTestReplacer(r)
		got := k.eval(r, repl)
		if k.constant {
			want := strings.NewReplacer("\\{", "{", "\\}", "}").Replace(template)
			if got != want || k.literal != want {
				t.Fatalf("constant %q: key %q literal %q, want %q", template, got, k.literal, want)
			}
		}
	})
}

// FuzzClientAddressKey: the default key (the client address Caddy
// determined, {http.vars.client_ip}) whatever a client sends in
// X-Forwarded-For (repeated, malformed, huge), Forwarded and X-Real-IP:
// filling it never panics, the headers never change it (the address is
// Caddy's, which TestCaddyClientIPTrustedProxies holds to the rightmost
// untrusted entry), and an IPv4-mapped IPv6 address keys as its IPv4
// address.
func FuzzClientAddressKey(f *testing.F) {
	for _, seed := range [][4]string{
		{"203.0.113.9", "1.2.3.4, 203.0.113.9", "for=192.0.2.60;proto=http", "10.0.0.1"},
		{"::ffff:203.0.113.9", "::ffff:1.2.3.4", `for="[2001:db8::1]:4711"`, ""},
		{"2001:db8::1", strings.Repeat("9.9.9.9, ", 500), "for=unknown", "garbage"},
		{"", ",,,", ";;;", "\x00"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	key, err := parseKeyTemplate(DefaultKey)
	if err != nil {
		f.Fatal(err)
	}
	fill := func(clientIP string, headers http.Header) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header = headers
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{"client_ip": clientIP}))
		return key.eval(r, caddyhttp.NewTestReplacer(r))
	}
	f.Fuzz(func(t *testing.T, clientIP, xff, forwarded, realIP string) {
		sent := http.Header{"X-Forwarded-For": {xff, xff + ", " + realIP}, "Forwarded": {forwarded}, "X-Real-Ip": {realIP}}
		got := fill(clientIP, sent)
		if bare := fill(clientIP, http.Header{}); got != bare {
			t.Fatalf("client address %q: key %q with the client's headers, %q without", clientIP, got, bare)
		}
		if a, err := netip.ParseAddr(clientIP); err == nil && a.Is4In6() {
			if v4 := fill(a.Unmap().String(), sent); got != v4 {
				t.Fatalf("%q keys %q, its IPv4 address %q", clientIP, got, v4)
			}
		}
	})
}
