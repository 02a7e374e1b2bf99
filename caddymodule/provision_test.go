package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core/openstore"
)

// provision loads h from JSON as Caddy would (Provision, then Validate).
func provision(t *testing.T, raw string) (*Handler, error) {
	t.Helper()
	var h Handler
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	err := h.Provision(ctx)
	if err == nil {
		err = h.Validate()
	}
	if err != nil {
		_ = h.Cleanup() // as Caddy does when provisioning fails
	}
	return &h, err
}

// TestJSONErrors checks that bad Caddy JSON is refused at load with an
// error naming the field and value.
func TestJSONErrors(t *testing.T) {
	before := openstore.Live()
	for _, tc := range []struct{ json, want string }{
		{`{}`, `policies: need at least one policy`},
		{`{"policies":[{"name":"","limits":[{"count":1,"window":1000000000}]}]}`, `policy name: must not be empty`},
		{`{"policies":[{"name":"a","limits":[]}]}`, `policy "a": needs at least one limit`},
		{`{"policies":[{"name":"a","limits":[{"count":0,"window":1000000000}]}]}`, `policy "a" limit 1: count: 0 must be at least 1`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":0}]}]}`, `policy "a" limit 1: window: 0s must be at least 1µs`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m","algorithm":"magic"}]}]}`, `policy "a" limit 1: algorithm: unknown algorithm "magic"`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m","algorithm":"leaky_bucket"}]}]}`, `policy "a" limit 1: max_delay: 0s must be above 0 for leaky_bucket`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m","burst":-1,"algorithm":"token_bucket"}]}]}`, `burst: -1 must be at least 1`},
		{`{"policies":[{"name":"a","cost":-1,"limits":[{"count":5,"window":"1m"}]}]}`, `policy "a" cost: -1 must not be negative`},
		// An option the algorithm would ignore is refused, naming it.
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"10s","algorithm":"sliding_log","burst":3}]}]}`, `policy "a" limit 1: burst: 3 means nothing to sliding_log`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"10s","algorithm":"gcra","max_delay":"1s"}]}]}`, `policy "a" limit 1: max_delay: 1s means nothing to gcra`},
		{`{"policies":[{"name":"a","empty_key":"x","limits":[{"count":5,"window":"1m"}]}]}`, `policy "a" empty_key: unknown "x"`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]},{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `policy "a": name used twice`},
		{`{"status":302,"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `status: 302 is not a 4xx or 5xx code`},
		{`{"headers":"loud","policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `headers: unknown style "loud"`},
		{`{"jitter":1.5,"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `jitter: 1.5 must be between 0 and 1`},
		{`{"store":{"type":"disk"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store type: unknown "disk"`},
		{`{"store":{"type":"redis"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store redis: needs a url`},
		{`{"store":{"type":"redis","url":"http://x"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `url: "http://x"`},
		{`{"store":{"type":"redis","addrs":["nohost"]},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `addrs: "nohost" is not host:port`},
		{`{"store":{"type":"redis","url":"redis://x:1","on_error":"pray"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store on_error: unknown value "pray"`},
		{`{"store":{"type":"redis","url":"redis://x:1","mode":"eventual","sync":"5ms"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store sync: 5ms must be at least 20ms`},
		{`{"store":{"type":"redis","url":"redis://x:1","mode":"eventual"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m","algorithm":"gcra"}]}]}`, `eventual mode counts requests, so it needs fixed_window or sliding_counter, not gcra`},
		{`{"store":{"type":"memory","url":"redis://x:1"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store memory: url, addrs`},
		{`{"store":{"type":"cluster","addrs":["a:1"],"db":3},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `db: 3, but Redis Cluster has only database 0`},
		{`{"policies":[{"name":"a","plans":[{"name":"free","limits":[{"count":5,"window":"1m"}]},{"name":"free","unlimited":true}],"default_plan":"free"}]}`, `policy "a" plan "free": named twice`},
		{`{"policies":[{"name":"a","plan":"{http.request.header.X-Plan}","plans":[{"name":"free","limits":[{"count":5,"window":"1m"}]}]}]}`, `policy "a" default_plan: missing`},
		{`{"policies":[{"name":"a","plans":[{"name":"free","limits":[{"count":5,"window":"1m"}]},{"name":"pro","limits":[{"count":50,"window":"1h"}]}],"default_plan":"free"}]}`, `plan "pro": limits of other windows`},
		{`{"store":{"max_keys":-5},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store max_keys: -5 must be between 0 (the default) and 1073741824`},
		{`{"policies":[{"name":"a","key":"{http.request.heder.X-Key}","limits":[{"count":5,"window":"1m"}]}]}`, `policy "a" key: "{http.request.heder.X-Key}": unknown placeholder {http.request.heder.X-Key}`},
		{`{"policies":[{"name":"a","key":"{http.request.header.X-Key","limits":[{"count":5,"window":"1m"}]}]}`, `policy "a" key: "{http.request.header.X-Key": the placeholder at byte 0 is not closed`},
		{`{"policies":[{"name":"a","key":"{}","limits":[{"count":5,"window":"1m"}]}]}`, `an empty placeholder {}`},
		{`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m"},{"count":10,"window":"1m"}]}]}`, `policy "a" limits 1 (5/1m) and 2 (10/1m): the same algorithm over the same window`},
		{`{"store":{"type":"redis","url":"redis://127.0.0.1:99999"},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `url: "127.0.0.1:99999" has port 99999, outside 0-65535`},
		{`{"store":{"type":"cluster","addrs":[":::not a host:::6379"]},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `addrs: ":::not a host:::6379" is not host:port`},
		{`{"store":{"max_keys":9223372036854775807},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`, `store max_keys: 9223372036854775807 must be between 0`},
		{`{"policies":[{"name":"a","key":"{http.request.header.}","limits":[{"count":5,"window":"1m"}]}]}`, `unknown placeholder {http.request.header.}`},
	} {
		_, err := provision(t, tc.json)
		if err == nil {
			t.Errorf("%s: provisioned; want error %q", tc.json, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %q", tc.json, err, tc.want)
		}
	}
	if after := openstore.Live(); after != before {
		t.Errorf("refused configs left %d stores open", after-before)
	}
}

// TestReloadSharesStore: a second handler with the same store config gets
// the same store (counters survive a reload), and the store closes with
// the last handler.
func TestReloadSharesStore(t *testing.T) {
	before := openstore.Live()
	const cfg = `{"store":{"max_keys":777},"policies":[{"name":"a","limits":[{"count":5,"window":"1m"}]}]}`
	old, err := provision(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reloaded, err := provision(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if old.store != reloaded.store {
		t.Fatal("equal store configs got different stores")
	}
	if got := openstore.Live(); got != before+1 {
		t.Fatalf("%d stores open, want %d", got, before+1)
	}
	_ = old.Cleanup()
	if got := openstore.Live(); got != before+1 {
		t.Fatalf("store closed while a handler still uses it")
	}
	_ = reloaded.Cleanup()
	if got := openstore.Live(); got != before {
		t.Fatalf("store still open after its last handler's cleanup")
	}
}

// TestReloadKeepsAdaptiveFactor: a reloaded config with the same adaptive
// policy keeps its controller (and so its factor); the last cleanup stops it.
func TestReloadKeepsAdaptiveFactor(t *testing.T) {
	const cfg = `{"policies":[{"name":"adapt-reload","limits":[{"count":100,"window":"1s"}],"adaptive":{"interval":"1h"}}]}`
	old, err := provision(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := old.policies[0].compiled.Policy.Adaptive()
	for i := 0; i < 50; i++ {
		a.Observe(503, time.Millisecond)
	}
	a.Judge() // nothing served: the factor falls to min, 0.1
	reloaded, err := provision(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = old.Cleanup()
	if got := reloaded.policies[0].compiled.Policy.Adaptive(); got != a || got.Factor() != 0.1 {
		t.Fatalf("after reload: same controller %v, factor %g; want the old one at 0.1", got == a, got.Factor())
	}
	if got := reloaded.policies[0].compiled.Policy.Limits()[0].Count; got != 10 {
		t.Fatalf("after reload the count is %d, want the adapted 10", got)
	}
	_ = reloaded.Cleanup()
}

// TestKeyReadLikeReplacer checks that a key is what Caddy's replacer gives
// for every key template shape, with the header absent or once, and that
// a header or query parameter sent twice keys on its first value, where
// the replacer joins the values into a key no other request has.
func TestKeyReadLikeReplacer(t *testing.T) {
	for _, key := range []string{
		"{http.request.header.x-api-key}", "{http.request.header.X-Api-Key}", "{http.vars.client_ip}", "{http.vars.tenant}",
		"k-{http.request.header.X-Api-Key}", "{http.request.header.X-Api-Key}{http.vars.tenant}",
		"{http.request.uri.query.token}", "q:{http.request.uri.query.token}:{http.request.method}", "\\{lit\\}{http.request.uri.query.token}",
	} {
		h, err := provision(t, `{"policies":[{"name":"p","key":`+strconv.Quote(key)+`,"limits":[{"count":1,"window":1000000000}]}]}`)
		if err != nil {
			t.Fatal(err)
		}
		for _, values := range [][]string{nil, {"alice"}, {"alice", "bob"}, {"alice", "alice"}} {
			query := url.Values{"token": values}.Encode()
			newRequest := func(values []string, query string) (*http.Request, *caddy.Replacer) {
				r := httptest.NewRequest("GET", "/?"+query, nil)
				r.Header["X-Api-Key"] = values
				r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{"client_ip": "192.0.2.1", "tenant": 7}))
				return r, caddyhttp.NewTestReplacer(r)
			}
			r, repl := newRequest(values, query)
			in, err := (&request{h: h, r: r, repl: repl}).Input(0)
			first, firstQuery := values, query
			if len(values) > 1 {
				first, firstQuery = values[:1], url.Values{"token": values[:1]}.Encode()
			}
			_, firstRepl := newRequest(first, firstQuery)
			if want := firstRepl.ReplaceKnown(key, ""); err != nil || in.Key != want {
				t.Errorf("key %s, header and query %q: got %q (%v), want %q", key, values, in.Key, err, want)
			}
		}
		_ = h.Cleanup()
	}
}
