package kongplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/store"
)

// Config is the plugin's configuration as Kong sends it: a superset of
// Kong's bundled rate-limiting plugin (3.x schema), so renaming the plugin
// from rate-limiting to tollgate keeps a config's meaning. Kong sends every
// schema field, null when unset: pointers tell unset from zero. go-pdk
// derives the schema from these types, so fields are int, float64, string,
// bool (no int64, no time.Duration), and json tags carry only the name.
type Config struct {
	// Second..Year are Kong's limits: requests per period. Month is 30 days
	// and year 365 days, as fixed windows aligned to the Unix epoch.
	Second *float64 `json:"second"`
	Minute *float64 `json:"minute"`
	Hour   *float64 `json:"hour"`
	Day    *float64 `json:"day"`
	Month  *float64 `json:"month"`
	Year   *float64 `json:"year"`
	// LimitBy picks the identifier: consumer (default), credential, ip,
	// service, header or path.
	LimitBy *string `json:"limit_by"`
	// HeaderName is the header for limit_by header.
	HeaderName *string `json:"header_name"`
	// Path is the path for limit_by path.
	Path *string `json:"path"`
	// Policy is local (default: this node's memory) or redis; cluster
	// (Kong's database) is refused.
	Policy *string `json:"policy"`
	// FaultTolerant keeps proxying while Redis fails (default true), with no
	// rate-limit headers, as Kong does; false answers 500.
	FaultTolerant *bool `json:"fault_tolerant"`
	// HideClientHeaders sends no rate-limit headers.
	HideClientHeaders *bool `json:"hide_client_headers"`
	// ErrorCode is the denial status (default 429).
	ErrorCode *float64 `json:"error_code"`
	// ErrorMessage is the denial message (default "API rate limit exceeded").
	ErrorMessage *string `json:"error_message"`
	// SyncRate is -1 (default) to decide every request in Redis, or a number
	// of seconds (at least 0.02) to count locally and sync that often.
	SyncRate *float64 `json:"sync_rate"`
	// Redis is Kong 3.x's nested Redis record.
	Redis *RedisConfig `json:"redis"`
	// The flat redis_* names of older Kong versions; the nested record wins.
	RedisHost       *string  `json:"redis_host"`
	RedisPort       *float64 `json:"redis_port"`
	RedisUsername   *string  `json:"redis_username"`
	RedisPassword   *string  `json:"redis_password"`
	RedisDatabase   *float64 `json:"redis_database"`
	RedisTimeout    *float64 `json:"redis_timeout"`
	RedisSSL        *bool    `json:"redis_ssl"`
	RedisSSLVerify  *bool    `json:"redis_ssl_verify"`
	RedisServerName *string  `json:"redis_server_name"`

	// Algorithm counts every limit: fixed_window (default, as Kong),
	// sliding_log, sliding_counter, token_bucket, gcra or leaky_bucket.
	Algorithm *string `json:"algorithm"`
	// Limits adds limits with any window.
	Limits []LimitConfig `json:"limits"`
	// Cost is the units each request takes (default 1).
	Cost *float64 `json:"cost"`
	// Shadow decides and reports but never denies.
	Shadow *bool `json:"shadow"`
	// Headers is kong (default: Kong's own header set), ietf, xratelimit,
	// both or none.
	Headers *string `json:"headers"`
	// Namespace shares counters between every plugin instance with the same
	// namespace; by default counters are per route and service the plugin is
	// attached to, as Kong's.
	Namespace *string `json:"namespace"`
	// OnError overrides fault_tolerant: local (limit on this node alone
	// while Redis is down), allow (Kong's fault_tolerant), deny or fail (500).
	OnError *string `json:"on_error"`
	// Adaptive scales the limits with the upstream's health, reported from
	// Kong's log phase.
	Adaptive *AdaptiveConfig `json:"adaptive"`

	// Kong adds route_id, service_id, consumer_id and __plugin_id to the
	// config it sends; they are not schema fields, but counters are scoped
	// by the route and service, as Kong's.
	attached attachment

	compiled *instance
}

// attachment is what Kong adds to a plugin config: where it is attached.
type attachment struct {
	RouteID   *string `json:"route_id"`
	ServiceID *string `json:"service_id"`
}

// RedisConfig is Kong's redis record, plus Cluster and Sentinel.
type RedisConfig struct {
	Host       *string  `json:"host"`
	Port       *float64 `json:"port"`
	Username   *string  `json:"username"`
	Password   *string  `json:"password"`
	Database   *float64 `json:"database"`
	Timeout    *float64 `json:"timeout"` // ms, default 2000
	SSL        *bool    `json:"ssl"`
	SSLVerify  *bool    `json:"ssl_verify"`
	ServerName *string  `json:"server_name"`
	// ClusterAddresses are "host:port" seeds of a Redis Cluster.
	ClusterAddresses []string `json:"cluster_addresses"`
	// SentinelMaster, SentinelAddresses ("host:port") and SentinelRole
	// (master; tollgate writes, so only the master will do) select Sentinel.
	SentinelMaster    *string  `json:"sentinel_master"`
	SentinelAddresses []string `json:"sentinel_addresses"`
	SentinelRole      *string  `json:"sentinel_role"`
	SentinelUsername  *string  `json:"sentinel_username"`
	SentinelPassword  *string  `json:"sentinel_password"`
}

// AdaptiveConfig tunes adaptive limiting; null fields take the defaults.
type AdaptiveConfig struct {
	// Enabled turns adaptive limiting on (default true when the record is set).
	Enabled *bool `json:"enabled"`
	// Min is the lowest fraction of the configured limits (default 0.1).
	Min *float64 `json:"min"`
	// ErrorRate is the upstream error fraction per interval above which
	// limits shrink (default 0.05).
	ErrorRate *float64 `json:"error_rate"`
	// Latency is the upstream latency target in ms for Quantile (default:
	// latency ignored).
	Latency *float64 `json:"latency"`
	// Quantile is the latency quantile (default 0.9).
	Quantile *float64 `json:"quantile"`
	// Interval is how often signals are judged, in seconds (default 1).
	Interval *float64 `json:"interval"`
	// Decrease multiplies the limits when the upstream struggles (0.7).
	Decrease *float64 `json:"decrease"`
	// Increase is added to the factor per healthy interval (0.05).
	Increase *float64 `json:"increase"`
	// MinSamples is the fewest responses per interval that can show
	// trouble (10).
	MinSamples *float64 `json:"min_samples"`
}

// spec reads a's Kong units (latency in ms, interval in seconds).
func (a *AdaptiveConfig) spec() (*core.AdaptiveSpec, error) {
	n, err := wholeNumber("adaptive.min_samples", num(a.MinSamples, 10), 1, 1<<30)
	return &core.AdaptiveSpec{
		Min: num(a.Min, 0), ErrorRate: num(a.ErrorRate, 0), Quantile: num(a.Quantile, 0),
		Decrease: num(a.Decrease, 0), Increase: num(a.Increase, 0), MinSamples: n,
		Latency:  core.Duration(num(a.Latency, 0) * float64(time.Millisecond)),
		Interval: core.Duration(num(a.Interval, 0) * float64(time.Second)),
	}, err
}

// LimitConfig is an extra limit: Count per Window.
type LimitConfig struct {
	Count float64 `json:"count"`
	// Window is a duration string ("10s", "1m", "1d"); a JSON number is
	// read as seconds.
	Window    Window  `json:"window"`
	Algorithm *string `json:"algorithm"`
	Burst     float64 `json:"burst"`
	// MaxDelay is leaky_bucket's longest delay, a duration string or seconds.
	MaxDelay Window  `json:"max_delay"`
	Name     *string `json:"name"`
}

// Window is a duration read from a string ("10s") or a number of seconds.
// Its schema type is string.
type Window string

// UnmarshalJSON reads a string or a number of seconds.
func (w *Window) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*w = ""
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*w = Window(s)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("%s is neither a duration string nor a number of seconds", b)
	}
	*w = Window(strconv.FormatFloat(secs, 'f', -1, 64) + "s")
	return nil
}

func (w Window) duration() (time.Duration, error) {
	if w == "" {
		return 0, nil
	}
	return core.ParseWindow(string(w))
}

// periods are Kong's limit fields, shortest first.
var periods = []struct {
	name   string // the field, and the limit's name (Kong's headers say Minute)
	window time.Duration
}{
	{"second", time.Second},
	{"minute", time.Minute},
	{"hour", time.Hour},
	{"day", 24 * time.Hour},
	{"month", 30 * 24 * time.Hour},
	{"year", 365 * 24 * time.Hour},
}

func (c *Config) periodValues() []*float64 {
	return []*float64{c.Second, c.Minute, c.Hour, c.Day, c.Month, c.Year}
}

// UnmarshalJSON decodes and validates a config. go-pdk checks a config only
// by decoding it when Kong starts an instance, so every check happens here;
// errors name the field and value.
func (c *Config) UnmarshalJSON(b []byte) error {
	type plain Config // without this method
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("tollgate config: %w", err)
	}
	*c = Config(p)
	if err := json.Unmarshal(b, &c.attached); err != nil {
		return fmt.Errorf("tollgate config: %w", err)
	}
	inst, err := compile(c)
	if err != nil {
		return fmt.Errorf("tollgate config: %w", err)
	}
	c.compiled = inst
	return nil
}

func str(p *string, def string) string {
	if p == nil || *p == "" {
		return def
	}
	return *p
}

func num(p *float64, def float64) float64 {
	if p == nil {
		return def
	}
	return *p
}

func flag(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// wholeNumber checks that v is an integer in [lo, hi].
func wholeNumber(field string, v, lo, hi float64) (int64, error) {
	if v != float64(int64(v)) || v < lo || v > hi {
		return 0, fmt.Errorf("%s: %v must be a whole number from %v to %v", field, v, lo, hi)
	}
	return int64(v), nil
}

// limitBys are the identifiers limit_by accepts.
var limitBys = []string{"consumer", "credential", "ip", "service", "header", "path"}

// compile validates c and builds what a request needs.
func compile(c *Config) (*instance, error) {
	inst := &instance{
		limitBy:    str(c.LimitBy, "consumer"),
		headerName: str(c.HeaderName, ""),
		path:       str(c.Path, ""),
		message:    str(c.ErrorMessage, "API rate limit exceeded"),
	}
	if !slices.Contains(limitBys, inst.limitBy) {
		return nil, fmt.Errorf("limit_by: unknown %q (want %s)", inst.limitBy, strings.Join(limitBys, ", "))
	}
	if inst.limitBy == "header" && inst.headerName == "" {
		return nil, fmt.Errorf("header_name: required when limit_by is header")
	}
	if inst.limitBy == "path" && inst.path == "" {
		return nil, fmt.Errorf("path: required when limit_by is path")
	}
	code, err := wholeNumber("error_code", num(c.ErrorCode, core.DefaultDenyStatus), 0, 1<<30)
	if err != nil {
		return nil, err
	}
	if err := core.CheckDenyStatus(int(code)); err != nil {
		return nil, fmt.Errorf("error_code: %w", err)
	}
	inst.status = int(code)
	cost, err := wholeNumber("cost", num(c.Cost, 1), 0, 1<<30)
	if err != nil {
		return nil, err
	}
	inst.cost = cost
	style, err := core.ParseHeaderStyle(str(c.Headers, "kong"))
	if err != nil {
		return nil, err
	}
	if flag(c.HideClientHeaders, false) {
		style = core.HeadersNone
	}
	inst.headers = core.HeaderOptions{Style: style}
	alg := str(c.Algorithm, core.FixedWindow.String())
	if _, err := core.ParseAlgorithm(alg); err != nil {
		return nil, fmt.Errorf("algorithm: %w", err)
	}

	// Kong's periods, then the extra limits; a longer period may not allow
	// fewer requests than a shorter one.
	var limits []core.LimitSpec
	var prevName string
	var prev float64
	for i, v := range c.periodValues() {
		if v == nil {
			continue
		}
		name := periods[i].name
		count, err := wholeNumber(name, *v, 1, 1<<50)
		if err != nil {
			return nil, err
		}
		if prevName != "" && *v < prev {
			return nil, fmt.Errorf("%s: %v is below %s's %v (a longer period must allow at least as many requests)", name, *v, prevName, prev)
		}
		prevName, prev = name, *v
		l := core.LimitSpec{Name: name, Count: count, Window: core.Duration(periods[i].window), Algorithm: alg}
		if _, err := l.Limit(); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		limits = append(limits, l)
	}
	for i, lc := range c.Limits {
		field := fmt.Sprintf("limits[%d]", i)
		count, err := wholeNumber(field+".count", lc.Count, 1, 1<<50)
		if err != nil {
			return nil, err
		}
		w, err := lc.Window.duration()
		if err != nil {
			return nil, fmt.Errorf("%s.window: %w", field, err)
		}
		if w == 0 {
			return nil, fmt.Errorf("%s.window: required (such as \"10s\")", field)
		}
		l := core.LimitSpec{Count: count, Window: core.Duration(w), Algorithm: str(lc.Algorithm, alg), Name: str(lc.Name, core.FormatWindow(w))}
		if l.Burst, err = wholeNumber(field+".burst", lc.Burst, 0, 1<<50); err != nil {
			return nil, err
		}
		maxDelay, err := lc.MaxDelay.duration()
		if err != nil {
			return nil, fmt.Errorf("%s.max_delay: %w", field, err)
		}
		l.MaxDelay = core.Duration(maxDelay)
		if _, err := l.Limit(); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		limits = append(limits, l)
	}
	if len(limits) == 0 {
		return nil, fmt.Errorf("second, minute, hour, day, month, year or limits: at least one limit is required")
	}

	// Counters are per route and service the plugin is attached to, as
	// Kong's, unless a namespace shares them.
	inst.scope = "route=" + str(c.attached.RouteID, "") + ",service=" + str(c.attached.ServiceID, "") + "|"
	spec := core.PolicySpec{Name: "tollgate", Limits: limits, Shadow: flag(c.Shadow, false)}
	if c.Namespace != nil && *c.Namespace != "" {
		inst.scope, spec.Name = "ns="+*c.Namespace+"|", *c.Namespace
	}
	if c.Adaptive != nil && flag(c.Adaptive.Enabled, true) {
		if spec.Adaptive, err = c.Adaptive.spec(); err != nil {
			return nil, err
		}
	}
	// An adaptive controller is shared per scope and settings, so the factor
	// survives Kong restarting the instance. Kong has no instance-close
	// hook, so it is never released: it lives with the process.
	if inst.policy, _, _, err = spec.Build("kong|" + inst.scope); err != nil {
		return nil, err
	}
	if inst.storeConfig, err = storeConfig(c); err != nil {
		return nil, err
	}
	if inst.storeConfig.Eventual {
		if err := inst.storeConfig.CheckPolicy(inst.policy); err != nil {
			return nil, fmt.Errorf("sync_rate: %v", err)
		}
	}
	return inst, nil
}

// storeConfig reads policy, redis, sync_rate, fault_tolerant and on_error.
func storeConfig(c *Config) (store.Config, error) {
	var sc store.Config
	policy := str(c.Policy, "local")
	// As Kong: fault tolerant proxies with no rate-limit headers while
	// Redis fails; on_error local keeps tollgate's local limiting instead.
	onError := core.OnErrorAllow
	if !flag(c.FaultTolerant, true) {
		onError = core.OnErrorFail
	}
	if c.OnError != nil && *c.OnError != "" {
		oe, err := core.ParseOnError(*c.OnError)
		if err != nil {
			return sc, err
		}
		onError = oe
	}
	sc.OnError = onError
	syncRate := num(c.SyncRate, -1)
	switch policy {
	case "local":
		return sc, nil
	case "cluster":
		return sc, fmt.Errorf("policy: %q keeps counters in Kong's database, which a Go plugin cannot reach; use \"redis\" (or \"local\")", policy)
	case "redis":
	default:
		return sc, fmt.Errorf("policy: unknown %q (want local or redis)", policy)
	}
	switch {
	case syncRate == -1 || syncRate == 0:
	case syncRate > 0:
		sc.Eventual = true
		sc.SyncInterval = time.Duration(syncRate * float64(time.Second))
		if err := core.CheckSyncInterval(sc.SyncInterval); err != nil {
			return sc, fmt.Errorf("sync_rate: %v seconds: %w", syncRate, err)
		}
	default:
		return sc, fmt.Errorf("sync_rate: %v must be -1 (synchronous) or at least %v seconds", syncRate, core.MinSyncInterval.Seconds())
	}
	r := c.Redis
	if r == nil {
		r = &RedisConfig{}
	}
	// The nested record wins over the flat names.
	pick := func(nested, flat *string) string { return str(nested, str(flat, "")) }
	pickNum := func(nested, flat *float64, def float64) float64 { return num(nested, num(flat, def)) }
	pickFlag := func(nested, flat *bool, def bool) bool { return flag(nested, flag(flat, def)) }
	host := pick(r.Host, c.RedisHost)
	port, err := wholeNumber("redis.port", pickNum(r.Port, c.RedisPort, 6379), 1, 65535)
	if err != nil {
		return sc, err
	}
	db, err := wholeNumber("redis.database", pickNum(r.Database, c.RedisDatabase, 0), 0, 1<<20)
	if err != nil {
		return sc, err
	}
	timeoutMS := pickNum(r.Timeout, c.RedisTimeout, 2000)
	if timeoutMS <= 0 {
		return sc, fmt.Errorf("redis.timeout: %v ms must be above 0", timeoutMS)
	}
	ro := &store.RedisConfig{
		Username: pick(r.Username, c.RedisUsername), Password: pick(r.Password, c.RedisPassword), DB: int(db),
		Timeout: time.Duration(timeoutMS * float64(time.Millisecond)),
		TLS:     pickFlag(r.SSL, c.RedisSSL, false), TLSServerName: pick(r.ServerName, c.RedisServerName),
	}
	ro.TLSInsecureSkipVerify = ro.TLS && !pickFlag(r.SSLVerify, c.RedisSSLVerify, false)
	switch {
	case len(r.ClusterAddresses) > 0:
		ro.Addrs, ro.Cluster = r.ClusterAddresses, true
	case str(r.SentinelMaster, "") != "":
		if role := str(r.SentinelRole, "master"); role != "master" {
			return sc, fmt.Errorf("redis.sentinel_role: %q, but rate limiting writes, so it needs master", role)
		}
		if len(r.SentinelAddresses) == 0 {
			return sc, fmt.Errorf("redis.sentinel_addresses: required with sentinel_master %q", *r.SentinelMaster)
		}
		ro.MasterName, ro.Addrs = *r.SentinelMaster, r.SentinelAddresses
		ro.SentinelUsername, ro.SentinelPassword = str(r.SentinelUsername, ""), str(r.SentinelPassword, "")
	default:
		if host == "" {
			return sc, fmt.Errorf("redis.host: required when policy is redis")
		}
		ro.Addrs = []string{host + ":" + strconv.FormatInt(port, 10)}
	}
	sc.Redis = ro
	return sc, nil
}
