package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestAdaptGolden adapts each testdata/*.caddyfile and compares Caddy's JSON
// with the .json beside it.
func TestAdaptGolden(t *testing.T) {
	for _, name := range []string{"full", "redis", "cluster_sentinel"} {
		t.Run(name, func(t *testing.T) {
			in, err := os.ReadFile("testdata/" + name + ".caddyfile")
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
				out, _, err := adapter.Adapt(in, nil)
				if err != nil {
					t.Fatal(err)
				}
				var buf bytes.Buffer
				if err := json.Indent(&buf, out, "", "\t"); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile("testdata/"+name+".json", append(buf.Bytes(), '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile("testdata/" + name + ".json")
			if err != nil {
				t.Fatal(err)
			}
			caddytest.AssertAdapt(t, string(in), "caddyfile", strings.TrimSuffix(string(want), "\n"))
		})
	}
}

// TestExampleAdapts keeps Caddyfile.example valid.
func TestExampleAdapts(t *testing.T) {
	in, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, _, err := adapter.Adapt(in, nil)
	if err != nil {
		t.Fatalf("Caddyfile.example: %v", err)
	}
	if !json.Valid(out) || !strings.Contains(string(out), `"handler":"tollgate"`) {
		t.Fatalf("Caddyfile.example adapted to %s", out)
	}
}

// TestCaddyfileErrors checks that each bad Caddyfile is refused with an
// error naming the field, the value and the line.
func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`limit 10/1m`, `unknown subdirective "limit"`},
		{`policy a {
			limit 0/1m
		}`, `policy "a" limit "0/1m": rate "0/1m": count "0" must be a whole number of at least 1`},
		{`policy a {
			limit 10/0s
		}`, `window`},
		{`policy a {
			limit 10/fortnight
		}`, `policy "a" limit "10/fortnight"`},
		{`policy a {
			limit 10/1m token_bucket burst 0
		}`, `burst: "0" is not a count of at least 1`},
		{`policy a {
			limit 10/1m leaky_bucket
		}`, `max_delay: 0s must be above 0 for leaky_bucket`},
		{`policy a {
			limit 10/1m bogus_algorithm
		}`, `"bogus_algorithm" is neither an algorithm`},
		{`policy a {
			limit 10/1m max_delay soon
		}`, `max_delay: "soon": not a duration (want e.g. 250ms, 10s, 1m30s, 1.5h, 1d, 1mo or 1y)`},
		{`policy a {
		}`, `policy "a": needs at least one limit`},
		{`policy a {
			limit 10/1m
			colour blue
		}`, `policy "a": unknown option "colour"`},
		{`policy a {
			limit 10/1s gcra
			adaptive {
				controller vegas
			}
		}`, `policy "a" adaptive controller: "vegas" is not gradient or aimd`},
		{`policy a {
			limit 10/1s gcra
			adaptive {
				tolerance 0.8
			}
		}`, `adaptive tolerance: 0.8 must be above 1`},
		{`policy a {
			limit 10/1m
			empty_key drop
		}`, `empty_key: unknown "drop"`},
		{`policy a {
			limit 10/1m
			cost -2
		}`, `cost: -2 must not be negative`},
		{`policy a {
			limit 10/1m
			key
		}`, `key: missing value`},
		{`policy a {
			limit 10/1m
			key a b
		}`, `unexpected "b" after the value "a"`},
		{`policy a {
			limit 10/1m
			match {
				nosuchmatcher x
			}
		}`, `getting matcher module 'nosuchmatcher'`},
		{`policy a {
			limit 10/1m
		}
		status 200`, `status: 200 is not a 4xx or 5xx code`},
		{`policy a {
			limit 10/1m
		}
		headers fancy`, `headers: unknown style "fancy"`},
		{`policy a {
			limit 10/1m
		}
		jitter 2`, `jitter: 2 must be between 0 and 1, at Caddyfile:6`},
		{`policy a {
			limit 10/1m
		}
		log_denials lots`, `log_denials: "lots" is not a number of lines per second`},
		{`policy a {
			limit 10/1m
			charge {
				status 99
			}
		}`, `policy "a" charge status: "99": want a status code (401), a class (4xx) or a range (500-599), at Caddyfile:6`},
		{`policy a {
			limit 10/1m
			charge {
				cost_entry total
			}
		}`, `policy "a" charge unknown option "cost_entry"`},
		{`policy a {
			limit 10/1m
			charge {
				cost -1
			}
		}`, `policy "a" charge cost: -1 must not be negative, at Caddyfile:6`},
		{`policy a {
			limit 10/1m
			charge {
				values MISS
			}
		}`, `policy "a" charge unknown option "values"`},
		{`policy a {
			limit 10/1m
			charge {
				usage total_tokens
				input_cost 2.5
			}
		}`, `policy "a" charge input_cost: 2.5 prices usage cost; usage is "total_tokens", at Caddyfile:7`},
		{`policy a {
			limit 10/1m
			charge {
				usage cost
				output_cost cheap
			}
		}`, `policy "a" charge output_cost: "cheap" is not a price of a million tokens`},
		{`policy a {
			limit 10/1m
			charge {
				usage cost
			}
		}`, `policy "a" charge usage: cost needs input_cost or output_cost, what a million tokens cost, at Caddyfile:6`},
		{`policy a {
			limit 10/1m after_response
		}`, `policy "a" after_response: needs the policy's charge`},
		{`policy a {
			limit 10/1m leaky_bucket max_delay 1s
			charge {
				status 200
			}
		}`, `after_response: leaky_bucket decides as a request arrives`},
		{`policy a {
			limit 10/1m
			penalty 0/10m 1h
		}`, `policy "a" penalty: rate "0/10m": count "0" must be a whole number of at least 1`},
		{`policy a {
			limit 10/1m
			penalty 5/10m never
		}`, `policy "a" penalty: "never": not a duration (want e.g.`},
		{`policy a {
			limit 10/1m
			penalty 5/10m
		}`, `policy "a" penalty: want <denials>/<window> <duration>`},
		{`policy a {
			limit 10/1m penalty
		}`, `algorithm: penalty is not a limit's algorithm`},
		{`policy a {
			limit 10/1m
			reserve 150% for 1
		}`, `policy "a" reserve: a share of 1.5 must be between 0 and 1, both excluded, at Caddyfile:5`},
		{`policy a {
			limit 10/1m
			reserve lots for 1
		}`, `policy "a" reserve: "lots" is not a share such as 0.2 or 20%`},
		{`policy a {
			limit 10/1m
			reserve 20% to 1
		}`, `policy "a" reserve: want <share> for <priority>`},
		{`policy a {
			limit 10/1m
			reserve 20% for critical
		}`, `policy "a" reserve: "critical" is not a whole priority`},
		{`policy a {
			limit 10/1m
			priority {http.request.header.X-Priority}
		}`, `policy "a" priority: "{http.request.header.X-Priority}" chooses nothing without a reserve`},
		{`store disk`, `store: unknown type "disk"`},
		{`store redis`, `store redis: want one URL`},
		{`store redis 127.0.0.1:18379`, `url: "127.0.0.1:18379" has no scheme: write redis://127.0.0.1:18379 (rediss:// for TLS)`},
		{`store redis redis://x:6379 {
			on_error panic
		}`, `store on_error: unknown value "panic" (want local, allow, deny or fail), at Caddyfile:4`},
		{`store redis redis://x:6379 {
			mode sometimes
		}`, `store mode: want exact, eventual or eventual sync <duration>`},
		{`store redis redis://x:6379 {
			timeout -1s
		}`, `store timeout: "-1s": not a duration`},
		{`store memory max_keys lots`, `store memory max_keys: "lots" is not a whole number`},
		{`store sentinel mymaster`, `store sentinel: want the master name and the sentinels'`},
		{`store memory
		store memory`, `store: given twice`},
		{``, `tollgate: needs at least one policy block`},
		{`policy a {
			plan {http.request.header.X-Plan}
			plans {
				free 10/1m
				pro 100/1m
			}
		}`, `policy "a" default_plan: missing`},
		{`policy a {
			plans {
				free 10/1m
			}
			default_plan gold
		}`, `policy "a" default_plan: "gold" is not one of its plans`},
		{`policy a {
			plans {
				free 10/1m
				pro 100/1h
			}
			default_plan free
		}`, `plan "pro": limits of other windows or algorithms than plan "free"'s`},
		{`policy a {
			plans {
				free lots
			}
			default_plan free
		}`, `policy "a" plan "free" limit "lots"`},
		{`policy a {
			limit 10/1m
			charge {
				cost_header X-Cost
				usage all_tokens
			}
		}`, `policy "a" charge usage: "all_tokens": want total_tokens, prompt_tokens, completion_tokens or cost, at Caddyfile:7`},
		{`policy a {
			key {remote_host}
			limit 10/1m leaky_bucket
		}`, `policy "a" limit 1: max_delay: 0s must be above 0 for leaky_bucket (shaping delays requests up to it), at Caddyfile:5`},
		{`policy a {
			limit 10/1m
		}
		policy a {
			limit 20/1m
		}`, `policy "a": name used twice`},
		{`store redis http://example.com`, `store redis: url: "http://example.com": redis: invalid URL scheme: http, at Caddyfile:3`},
		{`policy a {
			limit 1/1s
			limit 2/2s
			limit 3/3s
			limit 4/4s
			limit 5/5s
			limit 6/6s
			limit 7/7s
			limit 8/8s
			limit 9/9s
		}`, `policy "a": 9 limits, at most 8 may be stacked`},
		{`store redis redis://x:6379 {
			mode eventual
		}
		policy a {
			limit 10/1m gcra
		}`, `policy "a" limit 1 (10/1m): eventual mode counts requests, so it needs fixed_window or sliding_counter, not gcra`},
		{`policy a {
			limit 10/1m
			plans {
				free 10/1m
			}
			default_plan free
		}`, `policy "a": limits and plans: give one or the other`},
		{`policy a {
			limit 3/1m
		}
		jitter NaN`, `jitter: NaN must be between 0 and 1, at Caddyfile:6`},
		{`policy a {
			limit 3/1s gcra
			adaptive {
				min NaN
			}
		}`, `policy "a" adaptive min: "NaN" is not a fraction, at Caddyfile:6`},
		{`policy a {
			limit 3/1s gcra
			adaptive {
				tolerance +Inf
			}
		}`, `policy "a" adaptive tolerance: "+Inf" is not a number, at Caddyfile:6`},
		{`policy a {
			limit 3/1s gcra
			adaptive {
				min 0
			}
		}`, `policy "a" adaptive min: "0" must be above 0 (leave min out for its default)`},
		{`store memory max_keys 0`, `store memory max_keys: 0 must be at least 1 (leave max_keys out for its default), at Caddyfile:3`},
		{`store memory max_keys 9223372036854775807`, `store max_keys: 9223372036854775807 must be between 0 (the default) and 1073741824, at Caddyfile:3`},
		{`store redis redis://localhost:6379 {
			max_keys 1073741825
		}`, `store max_keys: 1073741825 must be between 0 (the default) and 1073741824`},
		{`policy a {
			limit 5/1m
			limit 5/1m
		}`, `policy "a" limits 1 (5/1m) and 2 (5/1m): the same algorithm over the same window`},
		{`policy a {
			limit 5/1m
			limit 10/1m
		}`, `policy "a" limits 1 (5/1m) and 2 (10/1m): the same algorithm over the same window, so only the smaller count ever decides; keep one, at Caddyfile:`},
		{`store redis redis://127.0.0.1:99999`, `store redis: url: "127.0.0.1:99999" has port 99999, outside 0-65535, at Caddyfile:3`},
		{`store redis redis://::::/0`, `store redis: url:`},
		{`store cluster 127.0.0.1:65536 127.0.0.1:7001`, `has port 65536, outside 0-65535`},
		{`policy a {
			limit 3/1m
			key {http.request.heder.X-Key}
		}`, `policy "a" key: "{http.request.heder.X-Key}": unknown placeholder {http.request.heder.X-Key}`},
		{`policy a {
			limit 3/1m
			key {http.request.header.X-Key
		}`, `the placeholder at byte 0 is not closed, at Caddyfile:5`},
		{`policy a {
			limit 3/1m
			key k}
		}`, `a '}' at byte 1 closes no placeholder`},
		{`policy a {
			limit 3/1m
			key {http.reqest.header.X-Key}
		}`, `unknown placeholder {http.reqest.header.X-Key}`},
		{`policy a {
			limit 3/1m
			key {heder.X-Key}
		}`, `unknown placeholder {heder.X-Key}`},
		{`policy a {
			plan {http.request.header.X-Plan
			plans {
				free 10/1m
			}
			default_plan free
		}`, `policy "a" plan: "{http.request.header.X-Plan": the placeholder at byte 0 is not closed`},
		// Checked with the whole config (config.Compile), said at the
		// line the field was written on.
		{`policy a {
			plans {
				free 10/1m
				pro 100/1h
			}
			default_plan free
		}`, `limits of other windows or algorithms than plan "free"'s (a key keeps its usage when its plan changes only if its plans count the same windows), at Caddyfile:6`},
		{`policy a {
			limit 10/1m
			key {remote_host}
			limit 20/1m
		}`, `policy "a" limits 1 (10/1m) and 2 (20/1m): the same algorithm over the same window, so only the smaller count ever decides; keep one, at Caddyfile:6`},
		{`policy a {
			limit 10/1m
		}
		store redis redis://127.0.0.1:6379 {
			timeout 1s
			mode eventual sync 5ms
		}`, `store sync: 5ms must be at least 20ms`},
		{`policy a {
			limit 10/1m
		}
		store redis redis://127.0.0.1:6379 {
			timeout 1s
			mode eventual sync 5ms
		}`, `at Caddyfile:8`},
		{`policy a {
			limit 10/1m
		}
		policy a {
			limit 20/1m
		}`, `policy "a": name used twice, at Caddyfile:6`},
		{`policy a {
			limit 10/1m
		}
		status 200`, `status: 200 is not a 4xx or 5xx code, at Caddyfile:6`},
	} {
		src := ":8080 {\n\ttollgate {\n\t\t" + tc.body + "\n\t}\n}\n"
		adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
		_, _, err := adapter.Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
		if err == nil {
			t.Errorf("%q: adapted without error; want %q", tc.body, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q:\n got %v\nwant %q", tc.body, err, tc.want)
		}
		if !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%q: error %q does not name the Caddyfile line", tc.body, err)
		}
	}
}
