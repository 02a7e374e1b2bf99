package kongplugin

import (
	"strings"
	"testing"
	"time"

	"github.com/Kong/go-pdk/test"

	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
)

// kongNulls is every schema field null, as Kong sends an unset config, plus
// the fields Kong adds.
const kongNulls = `"second":null,"minute":null,"hour":null,"day":null,"month":null,"year":null,
"limit_by":null,"header_name":null,"path":null,"policy":null,"fault_tolerant":null,
"hide_client_headers":null,"error_code":null,"error_message":null,"sync_rate":null,"redis":null,
"algorithm":null,"limits":null,"cost":null,"shadow":null,"headers":null,"namespace":null,"on_error":null,
"route_id":"r-1","service_id":null,"consumer_id":null,"__plugin_id":"p-1","__seq__":3`

func decode(t *testing.T, fields string) (*Config, error) {
	t.Helper()
	var c Config
	err := c.decode([]byte("{"+kongNulls+","+fields+"}"), AccessOnly)
	return &c, err
}

func TestConfigDefaultsSurviveNulls(t *testing.T) {
	c, err := decode(t, `"minute":5`)
	if err != nil {
		t.Fatal(err)
	}
	inst := c.compiled
	if inst.LimitBy != "consumer" || inst.ErrorCode != 429 || inst.ErrorMessage != "API rate limit exceeded" ||
		inst.built.Gate.Headers.Style != headers.PerLimit || inst.Cost != 1 || inst.built.Store.Redis != nil {
		t.Fatalf("defaults: %+v", inst)
	}
	l := inst.policy.Limits()[0]
	if l.Count != 5 || l.Window != time.Minute || l.Algorithm.String() != "fixed_window" {
		t.Fatalf("limit %+v, want 5/1m fixed_window as Kong", l)
	}
	if inst.scope != (gate.Scope{Name: "route=r-1,service=", Prefix: "route=r-1,service=|"}) {
		t.Fatalf("scope %q, want the attached route", inst.scope)
	}
}

func TestConfigRedisFlatAndNested(t *testing.T) {
	c, err := decode(t, `"minute":5,"policy":"redis","redis_host":"old","redis_port":6380,"redis_timeout":100`)
	if err != nil {
		t.Fatal(err)
	}
	r := c.compiled.built.Store.Redis
	if r.Addrs[0] != "old:6380" || time.Duration(r.Timeout) != 100*time.Millisecond {
		t.Fatalf("flat names: %+v", r)
	}
	// The record alone, Kong's defaults filling what is null.
	c, err = decode(t, `"minute":5,"policy":"redis","redis":{"host":"new","port":null,"database":2,"timeout":null,"ssl":true,"ssl_verify":true,"server_name":"r.internal"},"sync_rate":0.5`)
	if err != nil {
		t.Fatal(err)
	}
	sc := c.compiled.built.Store
	if sc.Redis.Addrs[0] != "new:6379" || sc.Redis.DB != 2 || time.Duration(sc.Redis.Timeout) != 2*time.Second || !sc.Redis.TLS ||
		sc.Redis.TLSSkipVerify || sc.Redis.TLSServerName != "r.internal" || !sc.Eventual || sc.SyncInterval != 500*time.Millisecond {
		t.Fatalf("nested record: %+v %+v", sc, sc.Redis)
	}
	// Kong 3.x's shorthand fields (kong/db/schema/init.lua,
	// process_auto_fields): a flat name goes into the record; both forms
	// with one value are taken (Kong's GET echoes both, so a config read
	// back and written again has them), and a record field set to another
	// value is refused in Kong's words. A record field at its default
	// counts as unset: Kong filled it.
	c, err = decode(t, `"minute":5,"policy":"redis","redis_host":"same","redis_database":3,"redis_port":6380,"redis":{"host":"same","port":6379,"database":0}`)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.compiled.built.Store.Redis; r.Addrs[0] != "same:6380" || r.DB != 3 {
		t.Fatalf("flat into nested: %+v", r)
	}
	for fields, want := range map[string]string{
		`"redis_host":"old","redis":{"host":"new"}`:                  "config.redis_host: both deprecated and new field are used but their values mismatch: redis_host = old vs redis.host = new",
		`"redis_host":"h","redis_database":3,"redis":{"database":2}`: "config.redis_database: both deprecated and new field are used but their values mismatch: redis_database = 3 vs redis.database = 2",
		`"redis_host":"h","redis_ssl":false,"redis":{"ssl":true}`:    "config.redis_ssl: both deprecated and new field are used but their values mismatch: redis_ssl = false vs redis.ssl = true",
	} {
		if _, err := decode(t, `"minute":5,"policy":"redis",`+fields); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", fields, err, want)
		}
	}
	c, err = decode(t, `"minute":5,"policy":"redis","redis":{"cluster_addresses":["a:1","b:2"]}`)
	if err != nil || !c.compiled.built.Store.Redis.Cluster {
		t.Fatalf("cluster: %v", err)
	}
	c, err = decode(t, `"minute":5,"policy":"redis","redis":{"sentinel_master":"m","sentinel_addresses":["a:1"],"sentinel_role":"master"}`)
	if err != nil || c.compiled.built.Store.Redis.Master != "m" {
		t.Fatalf("sentinel: %v", err)
	}
}

func TestConfigErrorsNameFieldAndValue(t *testing.T) {
	for _, tc := range []struct{ fields, want string }{
		// Kong's words exactly (01-schema_spec.lua "invalid limit"), though
		// limits and plans satisfy it too.
		{`"policy":"local"`, `at least one of these fields must be non-empty: 'config.second', 'config.minute', 'config.hour', 'config.day', 'config.month', 'config.year'`},
		{`"limits":[]`, `at least one of these fields must be non-empty: 'config.second', 'config.minute', 'config.hour', 'config.day', 'config.month', 'config.year'`},
		{`"minute":0`, `config.minute: value must be greater than 0 (got 0)`},
		{`"minute":-3`, `config.minute: value must be greater than 0 (got -3)`},
		{`"minute":5,"limit_by":"cookie"`, `config.limit_by: expected one of: consumer, credential, ip, service, header, path (got "cookie")`},
		{`"minute":5,"limit_by":"header"`, `config.header_name: required field missing (failed conditional validation given value of field 'config.limit_by')`},
		{`"minute":5,"limit_by":"path"`, `config.path: required field missing (failed conditional validation given value of field 'config.limit_by')`},
		{`"minute":5,"policy":"cluster"`, `policy: cluster keeps counters in Kong's database, and no Kong prefix says which (-kong-prefix; the keys command's --kong-prefix)`},
		{`"minute":5,"policy":"cluster","sync_rate":1`, `sync_rate: 1 counts on the node and syncs through Redis; policy cluster decides every request in Kong's database (sync_rate -1)`},
		{`"minute":5,"policy":"cluster","algorithm":"gcra"`, `algorithm: policy cluster keeps one count per period in Kong's database, as Kong's rate-limiting, so it takes fixed_window only, not gcra (limit 1, minute)`},
		{`"minute":5,"policy":"cluster","namespace":"shared"`, `namespace: "shared" shares counters across instances, and policy cluster keeps Kong's rows, one set per service and route`},
		{`"minute":5,"policy":"carrier-pigeon"`, `config.policy: expected one of: local, cluster, redis (got "carrier-pigeon")`},
		{`"minute":5,"policy":"redis"`, `must set one of 'config.redis.host', 'config.redis_host', 'config.redis.cluster_addresses', 'config.redis.sentinel_master' when 'policy' is 'redis'`},
		{`"minute":5,"policy":"redis","redis":{"host":"h","port":70000}`, `config.redis.port: value should be between 0 and 65535 (got 70000)`},
		{`"minute":5,"policy":"redis","redis":{"host":"h","timeout":-1}`, `config.redis.timeout: value should be between 0 and 2147483646 (got -1)`},
		{`"minute":5,"policy":"redis","redis_host":"h","sync_rate":0`, `config.sync_rate: sync_rate must be greater than 0.02, or -1 to disable (got 0)`},
		{`"minute":5,"sync_rate":1`, `config.sync_rate: sync_rate can only be used with the redis policy (got 1)`},
		{`"minute":5,"sync_rate":0`, `config.sync_rate: sync_rate can only be used with the redis policy (got 0)`},
		{`"minute":5,"limit_by":"path","path":"login"`, `config.path: should start with: / (got "login")`},
		{`"minute":5,"limit_by":"header","header_name":"bad header"`, `config.header_name: bad header name, allowed characters are A-Z, a-z, 0-9, '_', and '-' (got "bad header")`},
		{`"minute":5,"header_name":"x:y"`, `config.header_name: bad header name, allowed characters are A-Z, a-z, 0-9, '_', and '-' (got "x:y")`},
		{`"minute":5,"policy":"redis","redis":{"sentinel_master":"m","sentinel_addresses":["a:1"],"sentinel_role":"slave"}`, `config.redis.sentinel_role: expected one of: master (got "slave")`},
		{`"minute":5,"policy":"redis","redis_host":"h","sync_rate":0.01`, `config.sync_rate: sync_rate must be greater than 0.02, or -1 to disable (got 0.01)`},
		{`"minute":5,"policy":"redis","redis_host":"h","sync_rate":1,"algorithm":"gcra"`, `sync_rate: policy "tollgate" limit 1 (5/1m): eventual mode counts requests`},
		{`"minute":5,"error_code":200`, `config.error_code: value should be between 400 and 599 (got 200)`},
		{`"minute":5,"algorithm":"quantum"`, `config.algorithm: expected one of: fixed_window, sliding_log, sliding_counter, token_bucket, gcra, leaky_bucket (got "quantum")`},
		{`"minute":5,"headers":"loud"`, `config.headers: expected one of: kong, ietf, xratelimit, both, none, ai (got "loud")`},
		{`"minute":5,"on_error":"shrug"`, `config.on_error: expected one of: local, allow, deny, fail (got "shrug")`},
		{`"minute":5,"cost":-1`, `config.cost: value should be between 0 and 999999999999999 (got -1)`},
		{`"minute":5,"cost":1.5`, `config.cost: expected an integer (got 1.5)`},
		// The declaration refuses what a pattern can tell is no duration
		// (Kong's Admin API too); the plugin what only Go can tell.
		{`"limits":[{"count":5,"window":"soon"}]`, `config.limits[0].window: not a duration (want e.g. 250ms, 10s, 1m30s, 1.5h, 1d, 1mo or 1y) (got "soon")`},
		{`"limits":[{"count":5,"window":"1m30"}]`, `config.limits[0].window: not a duration (want e.g. 250ms, 10s, 1m30s, 1.5h, 1d, 1mo or 1y) (got "1m30")`},
		{`"limits":[{"count":5,"window":null}]`, `config.limits[0].window: required field missing`},
		{`"limits":[{"count":0,"window":"10s"}]`, `config.limits[0].count: value should be between 1 and 999999999999999 (got 0)`},
		{`"limits":[{"count":2.5,"window":"10s"}]`, `config.limits[0].count: expected an integer (got 2.5)`},
		{`"limits":[{"count":5,"window":"10s","algorithm":"leaky_bucket"}]`, `limits[0]: max_delay: 0s must be above 0 for leaky_bucket`},
		{`"limits":[{"count":5,"window":true}]`, `config.limits[0].window: expected a string (got true)`},
		{`"limits":[{"count":5,"window":"10s","algorithm":"sliding_log","burst":3}]`, `config.limits[0].burst: burst means nothing to fixed_window, sliding_log, sliding_counter or in_flight (token_bucket, gcra and leaky_bucket have a burst) (got 3)`},
		{`"algorithm":"sliding_log","limits":[{"count":5,"window":"10s","burst":3}]`, `limits[0]: burst: 3 means nothing to sliding_log`},
		{`"plans":[{"name":"free","minute":5}]`, `config.default_plan: required field missing`},
		{`"plans":[{"name":"free","minute":5}],"default_plan":"gold"`, `default_plan: "gold" is not one of its plans`},
		{`"minute":5,"plans":[{"name":"free","minute":5}],"default_plan":"free"`, `plans: set with second..year or limits; give one or the other`},
		{`"plans":[{"name":"free","minute":5},{"name":"pro","hour":50}],"default_plan":"free"`, `plan "pro": limits of other windows or algorithms than plan "free"'s`},
		{`"plans":[{"name":"free","limits":[{"count":5,"window":"soon"}]}],"default_plan":"free"`, `config.plans[0].limits[0].window: not a duration`},
		{`"plans":[{"name":"free","limits":[{"count":5,"window":"1m30"}]}],"default_plan":"free"`, `config.plans[0].limits[0].window: not a duration`},
		{`"plans":[{"name":"free"}],"default_plan":"free"`, `plan "free": needs at least one limit, or unlimited`},
		{`"plans":[{"minute":5}],"default_plan":"free"`, `config.plans[0].name: required field missing`},
		{`"plans":[{"name":"free","minute":5}],"default_plan":"free","plan_by":"header"`, `config.plan_header: required field missing`},
		{`"plans":[{"name":"free","minute":5}],"default_plan":"free","plan_by":"tier"`, `config.plan_by: expected one of: consumer_tag, header`},
		{`"minute":"five"`, `config.minute: expected a number (got "five")`},
		// Checked once, by the config package, and said at Kong's field.
		{`"minute":5,"penalty":{"denials":3,"within":0.0000001,"duration":60}`, `config.penalty: policy "tollgate" penalty window: 100ns must be at least 1µs`},
		{`"plans":[{"name":"free","minute":5},{"name":"pro","hour":5}],"default_plan":"free"`, `config.plans[1]: policy "tollgate" plan "pro": limits of other windows`},
		{`"limits":[{"count":5,"window":"10s","algorithm":"leaky_bucket","max_delay":"1s"},{"count":9,"window":"10s","algorithm":"leaky_bucket","max_delay":"1s"}]`, `limits[1]: policy "tollgate" limits 1 (5/10s) and 2 (9/10s): the same algorithm over the same window`},
	} {
		_, err := decode(t, tc.fields)
		if err == nil {
			t.Errorf("%s: accepted; want %q", tc.fields, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %q", tc.fields, err, tc.want)
		}
	}
}

func TestExtraLimitsWindows(t *testing.T) {
	c, err := decode(t, `"limits":[{"count":5,"window":"10s","algorithm":"sliding_log"},{"count":100,"window":"90s","burst":10,"algorithm":"token_bucket"}]`)
	if err != nil {
		t.Fatal(err)
	}
	ls := c.compiled.policy.Limits()
	if ls[0].Window != 10*time.Second || ls[1].Window != 90*time.Second || ls[1].Burst != 10 || ls[1].Name != "1m30s" {
		t.Fatalf("limits %+v", ls)
	}
}

// TestAcceptsWhatKongAccepts: configs Kong's schema accepts (typedefs.port
// and typedefs.timeout from 0, fractional limits above 0, a path and a
// header name as Kong's typedefs allow them) are accepted, and mean what
// they mean in Kong.
func TestAcceptsWhatKongAccepts(t *testing.T) {
	c, err := decode(t, `"minute":2.5,"hour":2.5,"limit_by":"path","path":"/login","header_name":"X-Api_Key-2","cost":0`)
	if err != nil {
		t.Fatal(err)
	}
	// Kong admits requests while the count used is below 2.5: three.
	if ls := c.compiled.policy.Limits(); ls[0].Count != 3 || ls[1].Count != 3 || c.compiled.Cost != 0 {
		t.Errorf("minute 2.5: limits %+v cost %d, want counts of 3 and cost 0", ls, c.compiled.Cost)
	}
	c, err = decode(t, `"minute":5,"policy":"redis","redis":{"host":"h","port":0,"timeout":0},"sync_rate":-1`)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.compiled.built.Store.Redis; r.Addrs[0] != "h:0" || time.Duration(r.Timeout) != 2*time.Second {
		t.Errorf("port 0, timeout 0: %+v, want h:0 and Kong's default 2000 ms", r)
	}
}

// TestPDKTestEnv runs the access phase in go-pdk's own test environment
// (its fixed consumer and IP), in addition to the socket tests.
func TestPDKTestEnv(t *testing.T) {
	c, err := decode(t, `"minute":2,"namespace":"pdk-test-env"`)
	if err == nil {
		err = c.compiled.open()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// Allowed requests only: go-pdk's test environment lacks
	// kong.nginx.set_ctx, with which a denial asks Kong for its delayed
	// response (TestKongDenialIsDelayed covers denials over the plugin
	// socket, internal/kongreal in real Kong).
	for i, want := range []int{200, 200} {
		env, err := test.New(t, test.Request{Method: "GET", Url: "http://example.com/x"})
		if err != nil {
			t.Fatal(err)
		}
		env.DoHttp(c)
		if env.ClientRes.Status != want {
			t.Fatalf("request %d: status %d, want %d", i+1, env.ClientRes.Status, want)
		}
		if got := env.ClientRes.Headers.Get("X-RateLimit-Remaining-Minute"); got != []string{"1", "0", "0"}[i] {
			t.Fatalf("request %d: X-RateLimit-Remaining-Minute %q", i+1, got)
		}
	}
}

// TestEveryKongLimitByAccepted: each identifier Kong's rate-limiting offers
// is accepted and kept.
func TestEveryKongLimitByAccepted(t *testing.T) {
	for _, by := range []string{`"consumer"`, `"credential"`, `"ip"`, `"service"`, `"header","header_name":"X-Key"`, `"path","path":"/login"`} {
		c, err := decode(t, `"minute":5,"limit_by":`+by)
		if err != nil {
			t.Errorf("limit_by %s refused: %v", by, err)
			continue
		}
		if want := strings.Trim(strings.SplitN(by, ",", 2)[0], `"`); c.compiled.LimitBy != want {
			t.Errorf("limit_by %s read as %q", by, c.compiled.LimitBy)
		}
	}
}
