//go:build kongreal

package kongreal

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/durationcorpus"
	"github.com/tollgate/tollgate/internal/redistest"
)

// verdict is what Kong's Admin API said of a plugin config posted to
// /config (DB-less): taken, or the errors it gave for the plugin entity.
type verdict struct {
	taken  bool
	errors string // the plugin's entry of the answer's "fields", as JSON
}

// postPlugin posts a config with one route carrying plugin with config,
// and returns Kong's verdict.
func postPlugin(k *Kong, plugin string, config map[string]any) verdict {
	status, body := k.LoadConfig(map[string]any{
		"_format_version": "3.0",
		"services": []any{map[string]any{"name": "verdicts", "url": "http://127.0.0.1:9", "routes": []any{
			map[string]any{"name": "verdicts", "paths": []string{"/verdicts"}, "plugins": []any{map[string]any{"name": plugin, "config": config}}}}}},
	})
	if status == http.StatusCreated || status == http.StatusOK {
		return verdict{taken: true}
	}
	var answer struct {
		Fields struct {
			Services []struct {
				Routes []struct {
					Plugins []json.RawMessage
				}
			}
		}
	}
	if err := json.Unmarshal(body, &answer); err != nil || len(answer.Fields.Services) != 1 || len(answer.Fields.Services[0].Routes) != 1 ||
		len(answer.Fields.Services[0].Routes[0].Plugins) != 1 {
		return verdict{errors: string(body)}
	}
	var v any
	_ = json.Unmarshal(answer.Fields.Services[0].Routes[0].Plugins[0], &v)
	b, _ := json.Marshal(v) // keys sorted
	return verdict{errors: string(b)}
}

// TestKongAdminAPIVerdicts posts each config to real Kong's Admin API
// (DB-less POST /config) twice: under Kong's rate-limiting and under
// tollgate, whose schema Kong read from `tollgate -dump`. Kong must give
// both the same verdict, in the same words, but where docs/kong.md's
// table says tollgate differs; there the test asserts exactly the
// difference. The configs are 01-schema_spec.lua's and the bad configs a
// user writes.
func TestKongAdminAPIVerdicts(t *testing.T) {
	k := Start(t, Options{})
	rds := redistest.StartT(t)
	redis := rds.KongRecord()
	for _, tc := range []struct {
		name   string
		config map[string]any
		// differs is docs/kong.md's row, when the verdicts differ on
		// purpose; kongTakes and tollgateTakes are then each side's.
		differs                  string
		kongTakes, tollgateTakes bool
	}{
		{name: "proper config validates", config: map[string]any{"second": 10}},
		{name: "proper config validates (bis)", config: map[string]any{"second": 10, "minute": 20, "hour": 30, "day": 40, "month": 50, "year": 60}},
		{name: "proper config validates (header)", config: map[string]any{"second": 10, "limit_by": "header", "header_name": "X-App-Version"}},
		{name: "proper config validates (path)", config: map[string]any{"second": 10, "limit_by": "path", "path": "/request"}},
		{name: "smaller unit is less than bigger unit", config: map[string]any{"second": 20, "hour": 10},
			differs: "periods out of order", kongTakes: false, tollgateTakes: true},
		{name: "no limit at all", config: map[string]any{}}, // Kong's words, though limits and plans satisfy them too
		{name: "limited by header, header_name missing", config: map[string]any{"second": 10, "limit_by": "header"}},
		{name: "limited by path, path missing", config: map[string]any{"second": 10, "limit_by": "path"}},
		{name: "redis with a host", config: map[string]any{"second": 10, "policy": "redis", "redis": redis}},
		{name: "redis legacy structure", config: map[string]any{"second": 10, "policy": "redis", "redis_host": "localhost", "redis_port": 6379,
			"redis_database": 0, "redis_timeout": 1100}},
		{name: "redis without a host", config: map[string]any{"second": 10, "policy": "redis"}, differs: "errors for a missing Redis host"},
		{name: "a negative limit", config: map[string]any{"minute": -1}},
		{name: "a limit that is not a number", config: map[string]any{"minute": "many"}},
		{name: "an unknown limit_by", config: map[string]any{"minute": 1, "limit_by": "planet"}},
		{name: "policy cluster", config: map[string]any{"minute": 1, "policy": "cluster"}}, // DB-less Kong refuses it too
		{name: "an unknown field", config: map[string]any{"minute": 1, "colour": "blue"}},
		{name: "fault_tolerant not a boolean", config: map[string]any{"minute": 1, "fault_tolerant": "yes"}},
		{name: "a header name with a space", config: map[string]any{"minute": 1, "limit_by": "header", "header_name": "X App"}, differs: "a bad `header_name`"},
		{name: "a path without its slash", config: map[string]any{"minute": 1, "limit_by": "path", "path": "request"}},
		{name: "a Redis port past 65535", config: map[string]any{"minute": 1, "policy": "redis", "redis": map[string]any{"host": "localhost", "port": 70000}}},
		{name: "error_code 600", config: map[string]any{"minute": 1, "error_code": 600}, differs: "error_code", kongTakes: true, tollgateTakes: false},
		{name: "a negative Redis database", config: map[string]any{"minute": 1, "policy": "redis", "redis": map[string]any{"host": "localhost", "database": -1}},
			differs: "redis.database", kongTakes: true, tollgateTakes: false},
		{name: "a 16-digit limit", config: map[string]any{"minute": 1e15 * 2}, differs: "counts", kongTakes: true, tollgateTakes: false},
		{name: "sync_rate with policy local", config: map[string]any{"minute": 1, "sync_rate": 1}, differs: "`sync_rate` with `policy: local`"},
		{name: "hide_client_headers, error_message", config: map[string]any{"minute": 1, "hide_client_headers": true, "error_message": "Slow down"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kong, tollgate := postPlugin(k, "rate-limiting", tc.config), postPlugin(k, "tollgate", tc.config)
			switch {
			case tc.differs == "" && kong != tollgate:
				t.Errorf("Kong's verdicts differ:\n  rate-limiting: %+v\n  tollgate:      %+v", kong, tollgate)
			case tc.differs != "" && (kong.taken != tc.kongTakes || tollgate.taken != tc.tollgateTakes || !kong.taken && !tollgate.taken && kong == tollgate):
				t.Errorf("docs/kong.md's %q: want rate-limiting taken %v and tollgate taken %v (and different words if both refused);\n  rate-limiting: %+v\n  tollgate:      %+v",
					tc.differs, tc.kongTakes, tc.tollgateTakes, kong, tollgate)
			}
			t.Logf("rate-limiting %+v; tollgate %+v", kong, tollgate)
		})
	}
}

// TestKongAdminAPIVerdictsResponseRateLimiting is TestKongAdminAPIVerdicts
// for Kong's response-ratelimiting and tollgate-response-ratelimiting
// (24-response-rate-limiting/01-schema_spec.lua's configs and more).
func TestKongAdminAPIVerdictsResponseRateLimiting(t *testing.T) {
	k := Start(t, Options{})
	for _, tc := range []struct {
		name    string
		config  map[string]any
		differs string // docs/kong.md's row: both refuse, in other words
	}{
		{"proper config validates", map[string]any{"limits": map[string]any{"video": map[string]any{"second": 1}}}, ""},
		{"proper config validates (bis)", map[string]any{"limits": map[string]any{"video": map[string]any{"second": 1, "minute": 2, "hour": 3, "day": 4, "month": 5, "year": 6}}}, ""},
		{"no limits", map[string]any{}, ""},
		{"a resource with no period", map[string]any{"limits": map[string]any{"video": map[string]any{}}}, ""},
		{"a negative limit", map[string]any{"limits": map[string]any{"video": map[string]any{"second": -1}}}, ""},
		{"an unknown period", map[string]any{"limits": map[string]any{"video": map[string]any{"decade": 1}}}, ""},
		{"block_on_first_violation not a boolean", map[string]any{"limits": map[string]any{"video": map[string]any{"second": 1}}, "block_on_first_violation": "yes"}, ""},
		{"limit_by header (not offered)", map[string]any{"limits": map[string]any{"video": map[string]any{"second": 1}}, "limit_by": "header"}, ""},
		{"policy redis without a host", map[string]any{"limits": map[string]any{"video": map[string]any{"second": 1}}, "policy": "redis"}, "errors for a missing Redis host"},
		{"an unknown field", map[string]any{"limits": map[string]any{"video": map[string]any{"second": 1}}, "colour": "blue"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kong, tollgate := postPlugin(k, "response-ratelimiting", tc.config), postPlugin(k, "tollgate-response-ratelimiting", tc.config)
			if tc.differs != "" {
				if kong.taken || tollgate.taken || kong == tollgate {
					t.Errorf("docs/kong.md's %q: want both refused in different words:\n  response-ratelimiting:          %+v\n  tollgate-response-ratelimiting: %+v", tc.differs, kong, tollgate)
				}
				return
			}
			if kong != tollgate {
				t.Errorf("Kong's verdicts differ:\n  response-ratelimiting:          %+v\n  tollgate-response-ratelimiting: %+v", kong, tollgate)
			}
		})
	}
}

// TestKongAdminAPIWindowsAsTheGrammar posts every window of the corpus
// the front doors share to real Kong's Admin API under tollgate: Kong
// (the dumped schema's Lua patterns, run by Kong) takes exactly the
// windows the plugin runs, and refuses the others in algo.ParseWindow's
// words, so no window Kong stores is refused by the plugin afterwards.
func TestKongAdminAPIWindowsAsTheGrammar(t *testing.T) {
	k := Start(t, Options{})
	for _, c := range durationcorpus.Windows {
		got := postPlugin(k, "tollgate", map[string]any{"limits": []any{map[string]any{"count": 5, "window": c.Text}}})
		words := "not a duration (" + algo.DurationExamples + ")"
		if _, err := algo.ParseWindow(c.Text); c.Text == "" {
			words = "length must be at least 1" // Kong's own words for an empty string
		} else if err != nil && strings.HasSuffix(err.Error(), "must be at least 1µs") {
			words = "must be at least 1µs"
		}
		switch {
		case c.Want != 0 && !got.taken:
			t.Errorf("window %q: Kong refused %s; the plugin runs it", c.Text, got.errors)
		case c.Want == 0 && got.taken:
			t.Errorf("window %q: Kong took it; the plugin refuses it", c.Text)
		case c.Want == 0 && !strings.Contains(got.errors, strings.ReplaceAll(words, "µ", `\u00b5`)) && !strings.Contains(got.errors, words):
			t.Errorf("window %q: Kong says %s, want %q", c.Text, got.errors, words)
		}
	}
}
