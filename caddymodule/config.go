package caddymodule

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/store"
)

// DefaultKey is a policy's key when none is set: the client IP as Caddy's
// trusted_proxies logic determines it (the Caddyfile's {client_ip}).
const DefaultKey = "{http.vars.client_ip}"

// StoreConfig selects where counters live.
type StoreConfig struct {
	// Type is "memory" (the default), "redis" (URL or Addrs), "cluster"
	// (Addrs are seed nodes) or "sentinel" (Master and the Sentinels' Addrs).
	Type string `json:"type,omitempty"`
	// MaxKeys caps the keys tracked in memory (the memory store, the local
	// fallback, eventual mode's local counts); 0 means 1,048,576.
	MaxKeys int `json:"max_keys,omitempty"`
	// URL is a redis:// or rediss:// URL (type redis).
	URL string `json:"url,omitempty"`
	// Addrs are host:port addresses: the server, Cluster seeds or Sentinels.
	Addrs []string `json:"addrs,omitempty"`
	// Master is the Sentinel master name (type sentinel).
	Master string `json:"master,omitempty"`
	// Username, Password and DB select the Redis user and database.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	DB       int    `json:"db,omitempty"`
	// SentinelPassword authenticates to the Sentinels.
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// TLS turns on TLS; TLSServerName overrides the verified name.
	TLS           bool   `json:"tls,omitempty"`
	TLSServerName string `json:"tls_server_name,omitempty"`
	// Timeout bounds one Redis decision (dial, write, read); default 500ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// PoolSize is the connections per Redis node; 0 means go-redis's default.
	PoolSize int `json:"pool_size,omitempty"`
	// Prefix starts every Redis key; default "tollgate:".
	Prefix string `json:"prefix,omitempty"`
	// OnError is what happens while Redis fails: "local" (default: limit on
	// this node alone), "allow", "deny" or "fail" (answer 503).
	OnError string `json:"on_error,omitempty"`
	// Mode is "exact" (default: every decision in Redis) or "eventual"
	// (decide locally, sync counts every Sync).
	Mode string `json:"mode,omitempty"`
	// Sync is eventual mode's sync interval; default 1s, at least 20ms.
	Sync caddy.Duration `json:"sync,omitempty"`
}

// storeConfig validates c and turns it into the core's store config.
func (c *StoreConfig) storeConfig() (store.Config, error) {
	var sc store.Config
	if c == nil {
		return sc, nil
	}
	if c.MaxKeys < 0 {
		return sc, fmt.Errorf("store max_keys: %d must not be negative", c.MaxKeys)
	}
	sc.MaxKeys = c.MaxKeys
	typ := c.Type
	if typ == "" {
		typ = "memory"
	}
	ro := &store.RedisConfig{
		URL: c.URL, Addrs: c.Addrs, Username: c.Username, Password: c.Password, DB: c.DB,
		SentinelPassword: c.SentinelPassword, TLS: c.TLS, TLSServerName: c.TLSServerName,
		Timeout: time.Duration(c.Timeout), PoolSize: c.PoolSize, Prefix: c.Prefix,
	}
	switch typ {
	case "memory":
		if c.URL != "" || len(c.Addrs) > 0 || c.Master != "" || c.Mode != "" || c.OnError != "" {
			return sc, fmt.Errorf("store memory: url, addrs, master, mode and on_error need a redis, cluster or sentinel store")
		}
		return sc, nil
	case "redis":
		if c.URL == "" && len(c.Addrs) == 0 {
			return sc, fmt.Errorf("store redis: needs a url (redis://host:port) or addrs")
		}
	case "cluster":
		if len(c.Addrs) == 0 {
			return sc, fmt.Errorf("store cluster: needs the seed nodes' addrs")
		}
		ro.Cluster = true
	case "sentinel":
		if c.Master == "" || len(c.Addrs) == 0 {
			return sc, fmt.Errorf("store sentinel: needs the master name and the sentinels' addrs (master %q, addrs %q)", c.Master, c.Addrs)
		}
		ro.MasterName = c.Master
	default:
		return sc, fmt.Errorf("store type: unknown %q (want memory, redis, cluster or sentinel)", c.Type)
	}
	if c.Timeout < 0 {
		return sc, fmt.Errorf("store timeout: %s must not be negative", time.Duration(c.Timeout))
	}
	sc.Redis = ro
	if c.OnError != "" {
		oe, err := core.ParseOnError(c.OnError)
		if err != nil {
			return sc, fmt.Errorf("store %w", err)
		}
		sc.OnError = oe
	}
	switch c.Mode {
	case "", "exact":
		if c.Sync != 0 {
			return sc, fmt.Errorf("store sync: %s is only for mode eventual", time.Duration(c.Sync))
		}
	case "eventual":
		sc.Eventual = true
		sc.SyncInterval = time.Duration(c.Sync)
		if err := core.CheckSyncInterval(sc.SyncInterval); err != nil {
			return sc, fmt.Errorf("store sync: %w", err)
		}
	default:
		return sc, fmt.Errorf("store mode: unknown %q (want exact or eventual)", c.Mode)
	}
	return sc, nil
}

// PolicyConfig is one named policy: the requests it covers, how it keys
// them and its stacked limits.
type PolicyConfig struct {
	// Name names the policy in headers, metrics and placeholders. Policies
	// with the same name and limits share counters across handlers and
	// survive config reloads.
	Name string `json:"name"`
	// MatcherSetsRaw selects the requests the policy covers; none means all.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`
	// Key is the request's key, with placeholders; default DefaultKey.
	Key string `json:"key,omitempty"`
	// EmptyKey is what happens when every placeholder in Key is empty:
	// "skip" (default: the policy does not apply) or "shared" (one bucket
	// for all such requests).
	EmptyKey string `json:"empty_key,omitempty"`
	// Limits are stacked: a request passes only if all allow it.
	Limits []LimitConfig `json:"limits"`
	// Cost is the units each request takes; default 1.
	Cost int64 `json:"cost,omitempty"`
	// Shadow decides and reports (headers, metrics, logs) but never denies.
	Shadow bool `json:"shadow,omitempty"`
	// Adaptive, if set, scales the policy's limits with the upstream's
	// health: down when its errors or latency pass their targets, back up
	// while it is healthy.
	Adaptive *AdaptiveConfig `json:"adaptive,omitempty"`
}

// AdaptiveConfig tunes adaptive limiting; zero fields take the defaults.
type AdaptiveConfig struct {
	// Min is the lowest fraction of the configured counts; default 0.1.
	Min float64 `json:"min,omitempty"`
	// ErrorRate is the upstream error fraction (5xx, 429, timeouts) per
	// interval above which limits shrink; default 0.05.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// Latency is the target for the Quantile of upstream latency; 0 ignores
	// latency.
	Latency caddy.Duration `json:"latency,omitempty"`
	// Quantile is the latency quantile; default 0.9.
	Quantile float64 `json:"quantile,omitempty"`
	// Interval is how often signals are judged; default 1s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Decrease multiplies the limits when the upstream struggles; default 0.7.
	Decrease float64 `json:"decrease,omitempty"`
	// Increase is added to the factor per healthy interval; default 0.05.
	Increase float64 `json:"increase,omitempty"`
	// MinSamples is the fewest responses per interval that can show
	// trouble; default 10.
	MinSamples int64 `json:"min_samples,omitempty"`
}

func (c *AdaptiveConfig) options() core.AdaptiveOptions {
	return core.AdaptiveOptions{
		MinFactor: c.Min, ErrorRate: c.ErrorRate, LatencyTarget: time.Duration(c.Latency), Quantile: c.Quantile,
		Interval: time.Duration(c.Interval), Decrease: c.Decrease, Increase: c.Increase, MinSamples: c.MinSamples,
	}
}

// LimitConfig is one limit: Count units per Window.
type LimitConfig struct {
	// Count is the units allowed per Window.
	Count int64 `json:"count"`
	// Window is the window length (a Caddy duration: "1s", "10m", "1d").
	Window caddy.Duration `json:"window"`
	// Algorithm is fixed_window, sliding_log, sliding_counter (default),
	// token_bucket, gcra or leaky_bucket.
	Algorithm string `json:"algorithm,omitempty"`
	// Burst is token_bucket's bucket size (default Count), the units gcra
	// admits at once (default 1), or leaky_bucket's queue size (default: what
	// MaxDelay holds).
	Burst int64 `json:"burst,omitempty"`
	// MaxDelay is leaky_bucket's longest shaping delay (its queue bound).
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`
	// Name labels the limit in headers; default "<count>/<window>".
	Name string `json:"name,omitempty"`
}

// limit validates c into a core limit; errors name the field and value.
func (c *LimitConfig) limit() (core.Limit, error) {
	l := core.Limit{Name: c.Name, Count: c.Count, Window: time.Duration(c.Window), Burst: c.Burst, MaxDelay: time.Duration(c.MaxDelay)}
	if c.Algorithm != "" {
		a, err := core.ParseAlgorithm(c.Algorithm)
		if err != nil {
			return l, fmt.Errorf("algorithm: %w", err)
		}
		l.Algorithm = a
	}
	return l, l.Validate()
}

// limits validates c (its adaptive settings aside) and returns its limits.
func (c *PolicyConfig) limits() ([]core.Limit, error) {
	if strings.TrimSpace(c.Name) == "" {
		return nil, fmt.Errorf("policy name: must not be empty")
	}
	if err := core.CheckCost(c.Cost); err != nil {
		return nil, fmt.Errorf("policy %q cost: %w", c.Name, err)
	}
	limits := make([]core.Limit, len(c.Limits))
	for i := range c.Limits {
		l, err := c.Limits[i].limit()
		if err != nil {
			return nil, fmt.Errorf("policy %q limit %d: %w", c.Name, i+1, err)
		}
		limits[i] = l
	}
	return limits, nil
}
