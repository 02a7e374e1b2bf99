package kongplugin

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
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
	// Second..Year are Kong's limits: requests per period. Month and year
	// are calendar periods in UTC (from the 1st, from 1 January), as Kong's.
	Second *float64 `json:"second"`
	Minute *float64 `json:"minute"`
	Hour   *float64 `json:"hour"`
	Day    *float64 `json:"day"`
	Month  *float64 `json:"month"`
	Year   *float64 `json:"year"`
	// LimitBy picks the identifier: consumer (default), credential, ip,
	// service, header (named by HeaderName) or path (equal to Path).
	LimitBy    *string `json:"limit_by"`
	HeaderName *string `json:"header_name"`
	Path       *string `json:"path"`
	// Policy is local (default: this node's memory) or redis; cluster
	// (Kong's database) is refused.
	Policy *string `json:"policy"`
	// FaultTolerant keeps proxying while Redis fails (default true), with no
	// rate-limit headers, as Kong does; false answers 500.
	FaultTolerant *bool `json:"fault_tolerant"`
	// HideClientHeaders sends no rate-limit headers.
	HideClientHeaders *bool `json:"hide_client_headers"`
	// ErrorCode (default 429) and ErrorMessage (default "API rate limit
	// exceeded") make the denial.
	ErrorCode    *float64 `json:"error_code"`
	ErrorMessage *string  `json:"error_message"`
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
	Cost *int `json:"cost"`
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

	// Kong adds route_id and service_id (not schema fields) to the config
	// it sends: counters are scoped by them, as Kong's.
	attached struct {
		RouteID   *string `json:"route_id"`
		ServiceID *string `json:"service_id"`
	}
	compiled *instance
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
// The fields are core.AdaptiveSpec's, with its meanings and defaults, but
// for Kong's units: Latency is in ms, Interval in seconds.
type AdaptiveConfig struct {
	// Enabled turns adaptive limiting on (default true when the record is set).
	Enabled    *bool    `json:"enabled"`
	Min        *float64 `json:"min"`         // lowest fraction of the limits (0.1)
	ErrorRate  *float64 `json:"error_rate"`  // upstream error fraction that shrinks them (0.05)
	Latency    *float64 `json:"latency"`     // ms target for Quantile (none)
	Quantile   *float64 `json:"quantile"`    // latency quantile (0.9)
	Interval   *float64 `json:"interval"`    // seconds between judgements (1)
	Decrease   *float64 `json:"decrease"`    // factor multiplier on trouble (0.7)
	Increase   *float64 `json:"increase"`    // factor added per healthy interval (0.05)
	MinSamples *int     `json:"min_samples"` // fewest responses that can show trouble (10)
}

// spec reads a's Kong units (latency in ms, interval in seconds); core
// validates it.
func (a *AdaptiveConfig) spec() *core.AdaptiveSpec {
	return &core.AdaptiveSpec{
		Min: or(a.Min, 0), ErrorRate: or(a.ErrorRate, 0), Quantile: or(a.Quantile, 0),
		Decrease: or(a.Decrease, 0), Increase: or(a.Increase, 0), MinSamples: int64(or(a.MinSamples, 0)),
		Latency:  core.Duration(or(a.Latency, 0) * float64(time.Millisecond)),
		Interval: core.Duration(or(a.Interval, 0) * float64(time.Second)),
	}
}

// LimitConfig is an extra limit: Count per Window.
type LimitConfig struct {
	Count int `json:"count"`
	// Window is a duration string: "10s", "1m", "1d".
	Window    *string `json:"window"`
	Algorithm *string `json:"algorithm"`
	Burst     int     `json:"burst"`
	// MaxDelay is leaky_bucket's longest delay, a duration string.
	MaxDelay *string `json:"max_delay"`
	Name     *string `json:"name"`
}

// spec reads l as the limit field names: core validates it.
func (l *LimitConfig) spec(field, algorithm string) (core.LimitSpec, error) {
	if str(l.Window, "") == "" {
		return core.LimitSpec{}, fmt.Errorf("%s.window: required (such as \"10s\")", field)
	}
	w, err := core.ParseWindow(*l.Window)
	if err != nil {
		return core.LimitSpec{}, fmt.Errorf("%s.window: %w", field, err)
	}
	var maxDelay time.Duration
	if str(l.MaxDelay, "") != "" {
		if maxDelay, err = core.ParseDuration(*l.MaxDelay); err != nil {
			return core.LimitSpec{}, fmt.Errorf("%s.max_delay: %w", field, err)
		}
	}
	return core.LimitSpec{Count: int64(l.Count), Window: core.Duration(w), Algorithm: str(l.Algorithm, algorithm),
		Burst: int64(l.Burst), MaxDelay: core.Duration(maxDelay), Name: str(l.Name, core.FormatWindow(w))}, nil
}

// UnmarshalJSON decodes and validates a config (go-pdk's only check, when
// Kong starts an instance); errors name the field and value.
func (c *Config) UnmarshalJSON(b []byte) error {
	type plain Config // without this method
	*c = Config{}
	err := json.Unmarshal(b, (*plain)(c))
	if err == nil {
		err = json.Unmarshal(b, &c.attached)
	}
	if err == nil {
		c.compiled, err = compile(c)
	}
	if err != nil {
		return fmt.Errorf("tollgate config: %w", err)
	}
	return nil
}

func str(p *string, def string) string {
	if p == nil || *p == "" {
		return def
	}
	return *p
}

// or is *p, or def when Kong sent null.
func or[T any](p *T, def T) T {
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

// headerName is what Kong's header_name typedef allows.
var headerName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// compile validates c and builds what a request needs.
func compile(c *Config) (*instance, error) {
	inst := &instance{
		limitBy: str(c.LimitBy, "consumer"), headerName: str(c.HeaderName, ""), path: str(c.Path, ""),
		message: str(c.ErrorMessage, "API rate limit exceeded"),
	}
	switch {
	case !slices.Contains([]string{"consumer", "credential", "ip", "service", "header", "path"}, inst.limitBy):
		return nil, fmt.Errorf("limit_by: unknown %q (want consumer, credential, ip, service, header or path)", inst.limitBy)
	case inst.limitBy == "header" && inst.headerName == "":
		return nil, fmt.Errorf("header_name: required when limit_by is header")
	case inst.limitBy == "path" && inst.path == "":
		return nil, fmt.Errorf("path: required when limit_by is path")
	case !headerName.MatchString(inst.headerName) && inst.headerName != "":
		return nil, fmt.Errorf("header_name: bad header name %q, allowed characters are A-Z, a-z, 0-9, '_', and '-'", inst.headerName)
	case inst.path != "" && !strings.HasPrefix(inst.path, "/"):
		return nil, fmt.Errorf("path: %q should start with: /", inst.path)
	}
	code, err := wholeNumber("error_code", or(c.ErrorCode, core.DefaultDenyStatus), 0, 1<<30)
	if err != nil {
		return nil, err
	}
	if err := core.CheckDenyStatus(int(code)); err != nil {
		return nil, fmt.Errorf("error_code: %w", err)
	}
	inst.status = int(code)
	if inst.cost = int64(or(c.Cost, 1)); core.CheckCost(inst.cost) != nil {
		return nil, fmt.Errorf("cost: %w", core.CheckCost(inst.cost))
	}
	style, err := core.ParseHeaderStyle(str(c.Headers, "kong"))
	if err != nil {
		return nil, err
	}
	if or(c.HideClientHeaders, false) {
		style = core.HeadersNone
	}
	inst.headers = core.HeaderOptions{Style: style}
	alg := str(c.Algorithm, core.FixedWindow.String())
	if _, err := core.ParseAlgorithm(alg); err != nil {
		return nil, fmt.Errorf("algorithm: %w", err)
	}

	// Kong's periods (a longer one may not allow fewer), then the extra limits.
	var limits []core.LimitSpec
	var fields []string
	var prev *float64
	for _, p := range []struct {
		name   string // the field, and the limit's name (Kong's headers say Minute)
		count  *float64
		window time.Duration
	}{
		{"second", c.Second, time.Second}, {"minute", c.Minute, time.Minute}, {"hour", c.Hour, time.Hour},
		{"day", c.Day, 24 * time.Hour}, {"month", c.Month, core.CalendarMonth}, {"year", c.Year, core.CalendarYear},
	} {
		if p.count == nil {
			continue
		}
		if *p.count <= 0 {
			return nil, fmt.Errorf("%s: %v must be greater than 0", p.name, *p.count)
		}
		if prev != nil && *p.count < *prev {
			return nil, fmt.Errorf("%s: %v is below %s's %v (a longer period must allow at least as many requests)", p.name, *p.count, fields[len(fields)-1], *prev)
		}
		prev = p.count
		// Kong admits requests while the count used is below a fractional
		// limit: 2.5 admits 3.
		count := int64(min(math.Ceil(*p.count), core.MaxCount+1))
		limits = append(limits, core.LimitSpec{Name: p.name, Count: count, Window: core.Duration(p.window), Algorithm: alg})
		fields = append(fields, p.name)
	}
	for i := range c.Limits {
		field := fmt.Sprintf("limits[%d]", i)
		l, err := c.Limits[i].spec(field, alg)
		if err != nil {
			return nil, err
		}
		limits, fields = append(limits, l), append(fields, field)
	}
	if len(limits) == 0 {
		return nil, fmt.Errorf("second, minute, hour, day, month, year or limits: at least one limit is required")
	}
	for i := range limits {
		if _, err := limits[i].Limit(); err != nil {
			return nil, fmt.Errorf("%s: %w", fields[i], err)
		}
	}

	// Counters are per route and service the plugin is attached to, as
	// Kong's, unless a namespace shares them.
	inst.scope = "route=" + str(c.attached.RouteID, "") + ",service=" + str(c.attached.ServiceID, "") + "|"
	spec := core.PolicySpec{Name: "tollgate", Limits: limits, Shadow: or(c.Shadow, false)}
	if c.Namespace != nil && *c.Namespace != "" {
		inst.scope, spec.Name = "ns="+*c.Namespace+"|", *c.Namespace
	}
	if c.Adaptive != nil && or(c.Adaptive.Enabled, true) {
		spec.Adaptive = c.Adaptive.spec()
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
	if err := inst.storeConfig.CheckPolicy(inst.policy); err != nil { // eventual mode's algorithms
		return nil, fmt.Errorf("sync_rate: %v", err)
	}
	return inst, nil
}

// storeConfig reads policy, redis, sync_rate, fault_tolerant and on_error
// into a store spec, which core validates.
func storeConfig(c *Config) (store.Config, error) {
	// As Kong: fault tolerant proxies with no rate-limit headers while
	// Redis fails; on_error local keeps tollgate's local limiting instead.
	spec := store.Spec{Type: "redis", OnError: "allow"}
	if !or(c.FaultTolerant, true) {
		spec.OnError = "fail"
	}
	if c.OnError != nil && *c.OnError != "" {
		spec.OnError = *c.OnError
	}
	if _, err := core.ParseOnError(spec.OnError); err != nil {
		return store.Config{}, err
	}
	syncRate := or(c.SyncRate, -1)
	switch policy := str(c.Policy, "local"); policy {
	case "local":
		if syncRate != -1 {
			return store.Config{}, fmt.Errorf("sync_rate: %v needs policy redis (policy is local, which counts on this node)", syncRate)
		}
		return store.Config{}, nil
	case "cluster":
		return store.Config{}, fmt.Errorf("policy: %q keeps counters in Kong's database, which a Go plugin cannot reach; use \"redis\" (or \"local\")", policy)
	case "redis":
	default:
		return store.Config{}, fmt.Errorf("policy: unknown %q (want local or redis)", policy)
	}
	switch {
	case syncRate == -1:
	case syncRate > 0:
		spec.Mode, spec.Sync = "eventual", core.Duration(syncRate*float64(time.Second))
		if err := core.CheckSyncInterval(time.Duration(spec.Sync)); err != nil {
			return store.Config{}, fmt.Errorf("sync_rate: %v seconds: %w", syncRate, err)
		}
	default:
		return store.Config{}, fmt.Errorf("sync_rate: %v must be -1 (synchronous) or at least %v seconds", syncRate, core.MinSyncInterval.Seconds())
	}
	r := cmp.Or(c.Redis, &RedisConfig{})
	// The nested record wins over the flat names.
	pick := func(nested, flat *string) string { return str(nested, str(flat, "")) }
	port, errPort := wholeNumber("redis.port", or(r.Port, or(c.RedisPort, 6379)), 0, 65535)
	timeoutMS, errTimeout := wholeNumber("redis.timeout", or(r.Timeout, or(c.RedisTimeout, 2000)), 0, 1<<31-2)
	db, errDB := wholeNumber("redis.database", or(r.Database, or(c.RedisDatabase, 0)), 0, 1<<20)
	if err := errors.Join(errPort, errTimeout, errDB); err != nil {
		return store.Config{}, err
	}
	// Kong allows a timeout of 0 ms: it takes the default, never unbounded.
	spec.Timeout = core.Duration(time.Duration(cmp.Or(timeoutMS, 2000)) * time.Millisecond)
	spec.Username, spec.Password, spec.DB = pick(r.Username, c.RedisUsername), pick(r.Password, c.RedisPassword), int(db)
	spec.TLS, spec.TLSServerName = or(r.SSL, or(c.RedisSSL, false)), pick(r.ServerName, c.RedisServerName)
	spec.TLSSkipVerify = !or(r.SSLVerify, or(c.RedisSSLVerify, false))
	switch {
	case len(r.ClusterAddresses) > 0:
		spec.Type, spec.Addrs = "cluster", r.ClusterAddresses
	case str(r.SentinelMaster, "") != "":
		if role := str(r.SentinelRole, "master"); role != "master" {
			return store.Config{}, fmt.Errorf("redis.sentinel_role: %q, but rate limiting writes, so it needs master", role)
		}
		spec.Type, spec.Master, spec.Addrs = "sentinel", *r.SentinelMaster, r.SentinelAddresses
		spec.SentinelUsername, spec.SentinelPassword = str(r.SentinelUsername, ""), str(r.SentinelPassword, "")
	case pick(r.Host, c.RedisHost) == "":
		return store.Config{}, fmt.Errorf("redis.host: required when policy is redis")
	default:
		spec.Addrs = []string{pick(r.Host, c.RedisHost) + ":" + strconv.FormatInt(port, 10)}
	}
	sc, err := spec.Config()
	if err != nil {
		return sc, fmt.Errorf("redis: %w", err)
	}
	return sc, nil
}
