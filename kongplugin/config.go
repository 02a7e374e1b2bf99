package kongplugin

import (
	"cmp"
	_ "embed" // schema.json
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/openstore"
	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongdb"
)

// Config is the plugin's configuration as Kong sends it: a superset of
// Kong's bundled rate-limiting plugin (3.x schema), so renaming the plugin
// from rate-limiting to tollgate keeps a config's meaning. schema.json
// declares it in Kong's schema language: `tollgate -dump` gives Kong that
// declaration, so the Admin API validates configs with it, and an
// instance's start checks its config against it and fills its defaults
// before the checks Kong cannot run (see decode and compile). Fields without a
// default are pointers or zero when unset.
type Config struct {
	// Periods are Kong's limits, and Limits tollgate's extra ones; or
	// Plans choose them per request.
	Periods
	Limits []LimitConfig `json:"limits"`
	// Plans are named sets of limits, chosen per request by PlanBy: the
	// consumer's tag that names a plan (consumer_tag), or the PlanHeader
	// header's value (header); DefaultPlan when neither names one.
	Plans       []PlanConfig `json:"plans"`
	PlanBy      string       `json:"plan_by"`
	PlanHeader  string       `json:"plan_header"`
	DefaultPlan string       `json:"default_plan"`
	// LimitBy picks the identifier: consumer, credential, ip, service,
	// header (named by HeaderName) or path (equal to Path).
	LimitBy    string `json:"limit_by"`
	HeaderName string `json:"header_name"`
	Path       string `json:"path"`
	// Policy is local (this node's memory), cluster (Kong's database) or
	// redis.
	Policy string `json:"policy"`
	// FaultTolerant keeps proxying while Redis fails, with no rate-limit
	// headers, as Kong does; false answers 500.
	FaultTolerant     bool `json:"fault_tolerant"`
	HideClientHeaders bool `json:"hide_client_headers"`
	// ErrorCode and ErrorMessage make the denial.
	ErrorCode    int    `json:"error_code"`
	ErrorMessage string `json:"error_message"`
	// SyncRate is -1 to decide every request in Redis, or seconds between
	// syncs of locally counted requests.
	SyncRate float64 `json:"sync_rate"`
	// RedisSettings are Kong 3.x's redis record and the flat redis_*
	// names of older versions.
	RedisSettings

	// Algorithm counts every limit.
	Algorithm string `json:"algorithm"`
	// Cost is the units each request takes.
	Cost int64 `json:"cost"`
	// Shadow decides and reports but never denies.
	Shadow bool `json:"shadow"`
	// Headers is kong (Kong's own header set), ietf, xratelimit, both,
	// none or ai (the X-AI-RateLimit-* set of a token budget, see
	// headers.AI; a denial's message then names the limit that refused,
	// its provider, as Kong's AI rate limiting does).
	Headers string `json:"headers"`
	// Namespace shares counters between every plugin instance with the same
	// namespace; by default counters are per route and service the plugin is
	// attached to, as Kong's.
	Namespace string `json:"namespace"`
	// LogDenials logs at most this many denials a second; ClearKeys shows
	// keys in clear there and to operators (hashed by default).
	LogDenials int  `json:"log_denials"`
	ClearKeys  bool `json:"clear_keys"`
	// OnError overrides fault_tolerant: local (limit on this node alone
	// while Redis is down), allow (Kong's fault_tolerant), deny or fail (500).
	OnError string `json:"on_error"`
	// Adaptive scales the limits with the upstream's health, reported from
	// Kong's log phase.
	Adaptive *AdaptiveConfig `json:"adaptive"`
	// Charge charges the limits what each response costs, in Kong's log
	// phase, instead of each request (see config.Charge).
	Charge *ChargeConfig `json:"charge"`
	// Penalty refuses a key for Duration seconds once its limits have
	// denied it Denials times within Within seconds (see config.Penalty).
	Penalty *PenaltyConfig `json:"penalty"`
	// Reserve holds Share of every limit back for requests whose
	// PriorityHeader is Level or above (see config.Reserve).
	Reserve *ReserveConfig `json:"reserve"`

	// Kong adds route_id and service_id (not schema fields) to the config
	// it sends: counters are scoped by them, as Kong's.
	attached struct {
		RouteID   string `json:"route_id"`
		ServiceID string `json:"service_id"`
	}
	compiled *instance
}

// Periods are Kong's limits: requests per period. Month and year are
// calendar periods in UTC (from the 1st, from 1 January), as Kong's.
type Periods struct {
	Second *float64 `json:"second"`
	Minute *float64 `json:"minute"`
	Hour   *float64 `json:"hour"`
	Day    *float64 `json:"day"`
	Month  *float64 `json:"month"`
	Year   *float64 `json:"year"`
}

// PlanConfig is one plan: its periods and extra limits, or unlimited.
type PlanConfig struct {
	Name string `json:"name"`
	Periods
	Limits    []LimitConfig `json:"limits"`
	Unlimited bool          `json:"unlimited"`
}

// RedisConfig is Kong's redis record, plus Cluster and Sentinel.
type RedisConfig struct {
	Host       string `json:"host"`
	Port       int    `json:"port"`
	Username   string `json:"username"`
	Password   string `json:"password"`
	Database   int    `json:"database"`
	Timeout    int    `json:"timeout"` // ms; 0 takes the default, 2000
	SSL        bool   `json:"ssl"`
	SSLVerify  bool   `json:"ssl_verify"`
	ServerName string `json:"server_name"`
	// ClusterAddresses are "host:port" seeds of a Redis Cluster.
	ClusterAddresses []string `json:"cluster_addresses"`
	// SentinelMaster, SentinelAddresses ("host:port") and SentinelRole
	// (master: tollgate writes) select Sentinel.
	SentinelMaster    string   `json:"sentinel_master"`
	SentinelAddresses []string `json:"sentinel_addresses"`
	SentinelRole      string   `json:"sentinel_role"`
	SentinelUsername  string   `json:"sentinel_username"`
	SentinelPassword  string   `json:"sentinel_password"`
}

// AdaptiveConfig tunes adaptive limiting; null fields take core's defaults.
// The fields are config.Adaptive's, with its meanings and defaults, but
// for Kong's units: Latency is in ms, Interval in seconds.
type AdaptiveConfig struct {
	Enabled    bool     `json:"enabled"`
	Controller *string  `json:"controller"`  // gradient (default) or aimd
	Min        *float64 `json:"min"`         // lowest fraction of the limits (0.1)
	ErrorRate  *float64 `json:"error_rate"`  // upstream error fraction that shrinks them (0.05)
	Latency    *float64 `json:"latency"`     // ms, a fixed target for Quantile (none)
	Tolerance  *float64 `json:"tolerance"`   // gradient: Quantile allowed above the unloaded latency (1.5×)
	Quantile   *float64 `json:"quantile"`    // latency quantile (0.9)
	Interval   *float64 `json:"interval"`    // seconds between judgements (0.5; aimd 1)
	Decrease   *float64 `json:"decrease"`    // margin (gradient, 0.95) or multiplier (aimd, 0.7) on trouble
	Increase   *float64 `json:"increase"`    // first probe (gradient) or step (aimd) per healthy interval (0.05)
	MinSamples *int     `json:"min_samples"` // fewest responses that can show trouble (10)
}

// spec reads a's Kong units (latency in ms, interval in seconds); core
// validates it.
func (a *AdaptiveConfig) spec() *config.Adaptive {
	return &config.Adaptive{
		Controller: or(a.Controller, ""), Tolerance: or(a.Tolerance, 0), Min: or(a.Min, 0), ErrorRate: or(a.ErrorRate, 0), Quantile: or(a.Quantile, 0),
		Decrease: or(a.Decrease, 0), Increase: or(a.Increase, 0), MinSamples: int64(or(a.MinSamples, 0)),
		Latency:  algo.Duration(or(a.Latency, 0) * float64(time.Millisecond)),
		Interval: algo.Duration(or(a.Interval, 0) * float64(time.Second)),
	}
}

// RedisSettings are the Redis fields of Kong's rate-limiting plugins:
// Kong 3.x's nested record, and the flat redis_* names of older versions,
// which go into the record as Kong 3.x's shorthands for them do (see
// redisRecord).
type RedisSettings struct {
	// Redis is Kong 3.x's nested Redis record.
	Redis RedisConfig `json:"redis"`
	// The flat redis_* names of older Kong versions go into the record,
	// as Kong 3.x's shorthands for them do (see redisRecord).
	RedisHost       *string `json:"redis_host"`
	RedisPort       *int    `json:"redis_port"`
	RedisUsername   *string `json:"redis_username"`
	RedisPassword   *string `json:"redis_password"`
	RedisDatabase   *int    `json:"redis_database"`
	RedisTimeout    *int    `json:"redis_timeout"`
	RedisSSL        *bool   `json:"redis_ssl"`
	RedisSSLVerify  *bool   `json:"redis_ssl_verify"`
	RedisServerName *string `json:"redis_server_name"`

	// notes are redisRecord's deprecation warnings, for Kong's log.
	notes []string
}

// ReserveConfig is config.Reserve, with the request header that carries a
// request's priority (a whole number; anything else is 0).
type ReserveConfig struct {
	Share          float64 `json:"share"`
	Level          int     `json:"level"`
	PriorityHeader string  `json:"priority_header"`
}

// PenaltyConfig is config.Penalty in Kong's units (seconds).
type PenaltyConfig struct {
	Denials  int64   `json:"denials"`
	Within   float64 `json:"within"`
	Duration float64 `json:"duration"`
}

// ChargeConfig is config.Charge as Kong sends it (null for unset fields).
type ChargeConfig struct {
	Status     []string `json:"status"`
	Header     *string  `json:"header"`
	Values     []string `json:"values"`
	CostHeader *string  `json:"cost_header"`
	CostEntry  *string  `json:"cost_entry"`
	// Usage charges the tokens of a language model's answer as Kong's
	// ai-proxy counted them (see answerUsage), or with "cost" what they
	// cost at InputCost and OutputCost (per million tokens).
	Usage      *string  `json:"usage"`
	InputCost  *float64 `json:"input_cost"`
	OutputCost *float64 `json:"output_cost"`
	Cost       *int64   `json:"cost"`
}

// spec reads c; core validates it.
func (c *ChargeConfig) spec() *config.Charge {
	return &config.Charge{Status: c.Status, Header: or(c.Header, ""), Values: c.Values, CostHeader: or(c.CostHeader, ""),
		CostEntry: or(c.CostEntry, ""), Usage: or(c.Usage, ""), InputCost: c.InputCost, OutputCost: c.OutputCost, Cost: c.Cost}
}

// LimitConfig is an extra limit: Count per Window.
type LimitConfig struct {
	Count int64 `json:"count"`
	// Window is a duration string: "10s", "1m", "1d".
	Window    string `json:"window"`
	Algorithm string `json:"algorithm"`
	Burst     int64  `json:"burst"`
	// MaxDelay is leaky_bucket's longest delay, a duration string.
	MaxDelay string `json:"max_delay"`
	Name     string `json:"name"`
}

// spec reads l as the limit field names: core validates it.
func (l *LimitConfig) spec(field, algorithm string) (config.Limit, error) {
	w, err := algo.ParseWindow(l.Window)
	if err != nil {
		return config.Limit{}, fmt.Errorf("%s.window: %w", field, err)
	}
	var maxDelay time.Duration
	if l.MaxDelay != "" {
		if maxDelay, err = algo.ParseDuration(l.MaxDelay); err != nil {
			return config.Limit{}, fmt.Errorf("%s.max_delay: %w", field, err)
		}
	}
	return config.Limit{Count: l.Count, Window: algo.Duration(w), Algorithm: cmp.Or(l.Algorithm, algorithm),
		Burst: l.Burst, MaxDelay: algo.Duration(maxDelay), Name: cmp.Or(l.Name, algo.FormatWindow(w))}, nil
}

// schemaJSON declares the config in Kong's schema language, once (for
// WithResponse; AccessOnly's is derived from it, see schemas): -dump gives
// it to Kong and decode checks every config against it. It is schema.json
// with the duration grammar's patterns in place (withDurationPatterns).
var schemaJSON = withDurationPatterns(schemaSource)

//go:embed schema.json
var schemaSource []byte

// decode checks a config against variant v's schema as Kong's Admin API
// does, fills Kong's defaults, then makes the checks Kong's schema cannot
// carry and compiles it (c.compiled); errors name the field and value.
func (c *Config) decode(b []byte, v Variant) error {
	*c = Config{}
	err := schemas[v]().Decode(b, c, &c.attached)
	if err == nil {
		c.compiled, err = compile(c)
	}
	if err != nil {
		return fmt.Errorf("tollgate config: %w", err)
	}
	return nil
}

// or is *p, or def when Kong sent null.
func or[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// compile makes the checks the schema cannot declare (eventual mode's
// algorithms, a limit's window) and builds what a request needs.
func compile(c *Config) (*instance, error) {
	inst := &instance{Config: c}
	warnPeriodOrder(&c.Periods, "", &inst.warnings)
	for i := range c.Plans {
		warnPeriodOrder(&c.Plans[i].Periods, fmt.Sprintf("plans[%d]: ", i), &inst.warnings)
	}
	response := config.Response{Status: c.ErrorCode, Headers: c.Headers} // checked by Compile
	if c.HideClientHeaders {
		response.Headers = "none"
	}

	limits, fields, err := c.Periods.limits(c.Limits, c.Algorithm, "")
	if err != nil {
		return nil, err
	}
	var planFields [][]string
	policy := config.Policy{Name: "tollgate", Limits: limits, Shadow: c.Shadow, DefaultPlan: c.DefaultPlan, ClearKeys: c.ClearKeys}
	inst.sampler = gate.NewDenialSampler(c.LogDenials)
	if len(c.Plans) > 0 && len(limits) > 0 {
		return nil, fmt.Errorf("plans: set with second..year or limits; give one or the other (each plan holds its limits)")
	}
	for i, plan := range c.Plans {
		ps := config.Plan{Name: plan.Name, Unlimited: plan.Unlimited}
		var pf []string
		if ps.Limits, pf, err = plan.Periods.limits(plan.Limits, c.Algorithm, fmt.Sprintf("plans[%d]: ", i)); err != nil {
			return nil, err
		}
		planFields = append(planFields, pf)
		policy.Plans = append(policy.Plans, ps)
	}

	// Counters are per route and service the plugin is attached to, as
	// Kong's, unless a namespace shares them.
	inst.scope = instanceScope(c.attached.RouteID, c.attached.ServiceID, c.Namespace)
	inst.who = "tollgate (" + inst.scope.Name + "): "
	if c.Namespace != "" {
		policy.Name = c.Namespace
	}
	if c.Adaptive != nil && c.Adaptive.Enabled {
		policy.Adaptive = c.Adaptive.spec()
	}
	if c.Reserve != nil {
		policy.Reserve = &config.Reserve{Share: c.Reserve.Share, For: c.Reserve.Level}
	}
	if c.Penalty != nil {
		policy.Penalty = &config.Penalty{Denials: c.Penalty.Denials, Within: algo.Duration(c.Penalty.Within * float64(time.Second)),
			For: algo.Duration(c.Penalty.Duration * float64(time.Second))}
	}
	if c.Charge != nil {
		policy.Charge = c.Charge.spec() // Compile checks it, naming charge's field
	}
	// The store's fields are read first, as eventual mode's check needs
	// them, but their errors come after the policy's own.
	sc, storeErr := storeConfig(c, inst.scope.Prefix)
	// An adaptive controller is shared per scope and settings, so the factor
	// survives Kong replacing the instance (it starts the new one before it
	// closes the old); Close releases it.
	if inst.built, err = config.Compile(config.Setup{Owner: "kong|" + inst.scope.Prefix, Policies: []*config.Policy{&policy},
		StoreConfig: sc, Response: response, DefaultStyle: headers.PerLimit, StyleNames: styleNames, Check: clusterCheck(c)}); err != nil {
		return nil, limitField(err, fields, planFields)
	}
	if storeErr != nil {
		inst.built.Release()
		return nil, storeErr
	}
	inst.policy = inst.built.Policies[0].Policy
	inst.warnings.lines = append(inst.warnings.lines, c.RedisSettings.notes...)
	return inst, nil
}

// clusterCheck is what policy cluster adds to Compile's checks of c's
// policy (Kong's rows keep one count per period and per route and
// service); nil for the other policies.
func clusterCheck(c *Config) func(*core.Policy) error {
	if c.Policy != "cluster" {
		return nil
	}
	return func(p *core.Policy) error { return checkCluster(p, c.Namespace) }
}

// KeysTarget compiles a plugin config of variant v as Kong sends it
// (route_id and service_id beside its fields; see
// kongschema.PluginConfig) for the keys command, with the settings of the
// Kong whose prefix is prefix ("": none), as a server that Kong started
// reads them (the keys command is a process of its own).
func (v Variant) KeysTarget(prefix string, b []byte) (keys.Target, error) {
	if prefix != "" {
		kongPrefix.Store(&prefix)
	}
	var c Config
	if err := c.decode(b, v); err != nil {
		return keys.Target{}, err
	}
	inst := c.compiled
	return keys.Target{Scope: inst.scope, Policies: []*core.Policy{inst.policy}, Store: inst.built.Store}, nil
}

// period is one of Kong's periods: its field, which is also the limit's
// name (Kong's headers say Minute), its count (nil when unset) and window.
type period struct {
	name   string
	count  *float64
	window time.Duration
}

// each lists ps's periods, shortest first.
func (ps *Periods) each() [6]period {
	return [6]period{
		{"second", ps.Second, time.Second}, {"minute", ps.Minute, time.Minute}, {"hour", ps.Hour, time.Hour},
		{"day", ps.Day, 24 * time.Hour}, {"month", ps.Month, algo.CalendarMonth}, {"year", ps.Year, algo.CalendarYear},
	}
}

// limits reads Kong's periods, then the extra limits, and returns each
// limit's name as Kong's config writes it, field before it (what a config
// error of the limit is said at: limitField); field prefixes their names
// in errors.
func (ps *Periods) limits(extra []LimitConfig, algorithm, field string) ([]config.Limit, []string, error) {
	var limits []config.Limit
	var fields []string
	for _, p := range ps.each() {
		if p.count == nil {
			continue
		}
		// Kong admits requests while the count used is below a fractional
		// limit: 2.5 admits 3.
		if *p.count > algo.MaxCount {
			return nil, nil, algo.AboveMaxCount(field+p.name, strconv.FormatFloat(*p.count, 'g', -1, 64))
		}
		count := int64(math.Ceil(*p.count))
		limits = append(limits, config.Limit{Name: p.name, Count: count, Window: algo.Duration(p.window), Algorithm: algorithm})
		fields = append(fields, field+p.name)
	}
	for i := range extra {
		l, err := extra[i].spec(fmt.Sprintf("%slimits[%d]", field, i), algorithm)
		if err != nil {
			return nil, nil, err
		}
		limits, fields = append(limits, l), append(fields, field+fmt.Sprintf("limits[%d]", i))
	}
	return limits, fields, nil
}

// limitField says a config error of the policy at its field in Kong's
// config: one of its limits at the limit's name (fields, the top level's,
// and plans', each plan's, as limits returned them), in the check's own
// words; a field Kong's config names as the config package does (reserve,
// penalty, charge, adaptive, default_plan) at config.<path>. Compile
// checks each rule once; Kong's names of the fields are the plugin's.
func limitField(err error, fields []string, plans [][]string) error {
	var ce *config.Error
	if !errors.As(err, &ce) {
		return err
	}
	var plan, limit int
	if n, _ := fmt.Sscanf(ce.Field, "limits[%d]", &limit); n == 1 && ce.Field == fmt.Sprintf("limits[%d]", limit) && limit < len(fields) {
		return fmt.Errorf("%s: %w", fields[limit], ce.Rule)
	}
	if n, _ := fmt.Sscanf(ce.Field, "plans[%d].limits[%d]", &plan, &limit); n == 2 && ce.Field == fmt.Sprintf("plans[%d].limits[%d]", plan, limit) &&
		plan < len(plans) && limit < len(plans[plan]) {
		return fmt.Errorf("%s: %w", plans[plan][limit], ce.Rule)
	}
	if strings.HasPrefix(ce.Field, "reserve.") || strings.HasPrefix(ce.Field, "charge") || strings.HasPrefix(ce.Field, "plans[") ||
		ce.Field == "penalty" || ce.Field == "adaptive" || ce.Field == "default_plan" {
		// Written under the same name in Kong's config.
		return fmt.Errorf("config.%s: %w", ce.Field, ce.Err)
	}
	return err
}

// warnPeriodOrder notes, in Kong's words, a longer period that allows fewer
// requests than a shorter one: Kong's rate-limiting refuses that order in
// Lua (schema.lua, validate_periods_order), which no dumped schema can
// carry, so Kong's Admin API stores it for tollgate. tollgate enforces each
// period on its own, so the config works; refusing it here would fail
// every request of the route.
func warnPeriodOrder(ps *Periods, field string, w *warnings) {
	var prev *float64
	prevName := ""
	for _, p := range ps.each() {
		if p.count == nil {
			continue
		}
		if prev != nil && *p.count < *prev {
			w.add("config: %sThe limit for %s(%.1f) cannot be lower than the limit for %s(%.1f) in Kong's rate-limiting; tollgate enforces each period",
				field, p.name, *p.count, prevName, *prev)
			return
		}
		prev, prevName = p.count, p.name
	}
}

// storeConfig reads policy, redis, sync_rate, fault_tolerant and on_error
// into a store spec, which core validates; a store that failed to read is
// the zero config (its error says why).
func storeConfig(c *Config, scope string) (openstore.Config, error) {
	return storeOf(c.Policy, c.FaultTolerant, c.OnError, c.SyncRate, &c.RedisSettings, clusterScope{table: kongdb.RateLimiting,
		prefix: scope, serviceID: c.attached.ServiceID, routeID: c.attached.RouteID})
}

// storeOf reads a config's store fields (policy, fault_tolerant, on_error,
// sync_rate and the Redis settings) into a store spec, which core
// validates.
func storeOf(policy string, faultTolerant bool, onError string, syncRate float64, rs *RedisSettings, cs clusterScope) (openstore.Config, error) {
	if policy == "cluster" {
		if syncRate != -1 {
			return openstore.Config{}, fmt.Errorf("sync_rate: %s counts on the node and syncs through Redis; policy cluster decides every request in Kong's database (sync_rate -1)", strconv.FormatFloat(syncRate, 'g', -1, 64))
		}
		return clusterStore(cs, faultTolerant, onError)
	}
	if policy != "redis" {
		return openstore.Config{}, nil
	}
	st := config.Store{Type: "redis", OnError: failurePolicy(faultTolerant, onError)}
	if syncRate != -1 {
		const longest = 24 * time.Hour // far beyond any period a sync can serve; a larger value is a typo
		if syncRate > longest.Seconds() {
			return openstore.Config{}, fmt.Errorf("sync_rate: %s seconds is above a day (%g)", strconv.FormatFloat(syncRate, 'g', -1, 64), longest.Seconds())
		}
		st.Mode, st.Sync = "eventual", algo.Duration(syncRate*float64(time.Second))
	}
	r, err := rs.redisRecord()
	if err != nil {
		return openstore.Config{}, err
	}
	// Kong allows a timeout of 0 ms: it takes the default, never unbounded.
	st.Timeout = algo.Duration(time.Duration(cmp.Or(r.Timeout, 2000)) * time.Millisecond)
	st.Username, st.Password = r.Username, r.Password
	st.DB, st.TLS, st.TLSServerName = r.Database, r.SSL, r.ServerName
	st.TLSSkipVerify = !r.SSLVerify
	if r.SSL && r.SSLVerify {
		trust, err := readKongTrust(startingKong())
		if err != nil {
			return openstore.Config{}, err
		}
		st.TLSCA, st.TLSMaxChain = trust.caFile, trust.maxChain
	}
	switch host := r.Host; {
	case len(r.ClusterAddresses) > 0:
		st.Type, st.Addrs = "cluster", r.ClusterAddresses
	case r.SentinelMaster != "":
		st.Type, st.Master, st.Addrs = "sentinel", r.SentinelMaster, r.SentinelAddresses
		st.SentinelUsername, st.SentinelPassword = r.SentinelUsername, r.SentinelPassword
	default:
		st.Addrs = []string{net.JoinHostPort(host, strconv.Itoa(r.Port))} // [::1]:6379 for IPv6
	}
	sc, err := st.Config()
	if err != nil {
		return openstore.Config{}, fmt.Errorf("redis: %w", err)
	}
	if sc.Eventual {
		sc.ModeSetting = "sync_rate" // eventual mode's errors name it
	}
	return sc, nil
}

// failurePolicy is the on_error a config's fault_tolerant and on_error
// name for a shared store (Redis, or Kong's database) that fails: as Kong,
// fault tolerant proxies with no rate-limit headers ("allow") and
// otherwise answers an error ("fail"); on_error, when set, decides
// instead (local keeps limiting on the node).
func failurePolicy(faultTolerant bool, onError string) string {
	if onError != "" {
		return onError
	}
	if faultTolerant {
		return "allow"
	}
	return "fail"
}

// redisRecord is the redis record with the flat redis_* names applied as
// Kong 3.x applies its shorthand fields (kong/db/schema/init.lua,
// process_auto_fields and validate_deprecation_exclusiveness; the fields'
// list in kong/plugins/rate-limiting/schema.lua): a flat name's value goes
// into the record, with Kong's deprecation warning, and a record field set
// to another value is refused in Kong's words. A dump cannot declare
// shorthands (they need a Lua function), so Kong stores both forms as
// given, with the record's defaults filled: a record field at its default
// is taken as unset, since the plugin cannot tell a written default from
// a filled one (Kong would refuse {"redis_port": 6380, "redis": {"port":
// 6379}}; the plugin dials 6380).
func (c *RedisSettings) redisRecord() (RedisConfig, error) {
	r := c.Redis
	w := &c.notes
	errs := []error{
		shorthand("host", c.RedisHost, &r.Host, "", w),
		shorthand("port", c.RedisPort, &r.Port, 6379, w),
		shorthand("username", c.RedisUsername, &r.Username, "", w),
		shorthand("password", c.RedisPassword, &r.Password, "", w),
		shorthand("database", c.RedisDatabase, &r.Database, 0, w),
		shorthand("timeout", c.RedisTimeout, &r.Timeout, 2000, w),
		shorthand("ssl", c.RedisSSL, &r.SSL, false, w),
		shorthand("ssl_verify", c.RedisSSLVerify, &r.SSLVerify, false, w),
		shorthand("server_name", c.RedisServerName, &r.ServerName, "", w),
	}
	for _, err := range errs {
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// shorthand applies the flat field redis_<name> (legacy, nil when unset)
// to the record's field, whose default is def (Kong's null for strings).
func shorthand[T comparable](name string, legacy *T, field *T, def T, notes *[]string) error {
	if legacy == nil {
		return nil
	}
	*notes = append(*notes, fmt.Sprintf("config.redis_%s is deprecated, please use config.redis.%s instead", name, name))
	if *field != def && *field != *legacy {
		return fmt.Errorf("config.redis_%s: both deprecated and new field are used but their values mismatch: redis_%s = %v vs redis.%s = %v",
			name, name, *legacy, name, *field)
	}
	*field = *legacy
	return nil
}

// styleNames are the header styles' names in Kong configs beside core's:
// `headers: kong`, the default, exactly the set Kong's rate-limiting sends.
var styleNames = map[string]headers.Style{"kong": headers.PerLimit}
