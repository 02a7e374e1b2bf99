package config

import (
	"fmt"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/openstore"
	"github.com/tollgate/tollgate/core/store/eventual"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/store/redis"
)

// RedisConfig is the Redis store's options: the redis.Settings a config
// gives (declared once there, embedded in Store too), and Cluster. Configs
// leave its tuning fields (Clock, Batch, Lanes, NoDenyCache) zero.
type RedisConfig = redis.Options

// Store is a store as configured (in JSON, or written as option lines):
// where counters live and what happens when Redis fails. Config turns it
// into the openstore.Config a Compiled config holds and openstore opens.
type Store struct {
	// Type is "memory" (the default), "redis" (URL or Addrs), "cluster"
	// (Addrs are seed nodes) or "sentinel" (Master and the Sentinels' Addrs).
	Type string `json:"type,omitempty"`
	// MaxKeys caps the keys tracked in memory (the memory store, the local
	// fallback, eventual mode's local counts); 0 means each one's
	// default: 1,048,576 keys, and 100,000 for eventual mode's counts.
	MaxKeys int `json:"max_keys,omitempty"`
	// Settings say how to reach Redis (types redis, cluster and
	// sentinel); Timeout defaults to 500ms and Prefix to "tollgate:".
	redis.Settings
	// OnError is what happens while Redis fails: "local" (default: limit on
	// this node alone), "allow", "deny" or "fail" (the adapter answers its
	// error status).
	OnError string `json:"on_error,omitempty"`
	// Mode is "exact" (default: every decision in Redis) or "eventual"
	// (decide locally, sync counts every Sync).
	Mode string `json:"mode,omitempty"`
	// Sync is eventual mode's sync interval; default 1s, at least 20ms.
	Sync algo.Duration `json:"sync,omitempty"`
}

// MaxKeysLimit is the largest max_keys a store takes (keys).
const MaxKeysLimit = memory.MaxMaxKeys

// CheckMaxKeys reports whether n is a usable max_keys (0, the default, up
// to MaxKeysLimit keys), in the memory store's wording.
func CheckMaxKeys(n int) error { return memory.CheckMaxKeys(n) }

// Config validates s and returns the store config it describes. Errors name
// the field and value.
func (s *Store) Config() (openstore.Config, error) {
	var c openstore.Config
	if s == nil {
		return c, nil
	}
	if err := CheckMaxKeys(s.MaxKeys); err != nil {
		return c, at("max_keys", fmt.Errorf("store %w", err))
	}
	c.MaxKeys = s.MaxKeys
	r := &RedisConfig{Settings: s.Settings}
	// A CA file turns TLS on; skipping verification needs TLS asked for.
	r.TLS, r.TLSSkipVerify = s.TLS || s.TLSCA != "", s.TLS && s.TLSSkipVerify
	switch s.Type {
	case "", "memory":
		if s.URL != "" || len(s.Addrs) > 0 || s.Master != "" || s.Mode != "" || s.OnError != "" {
			return c, fmt.Errorf("store memory: url, addrs, master, mode and on_error need a redis, cluster or sentinel store")
		}
		return c, nil
	case "redis":
		if s.URL == "" && len(s.Addrs) == 0 {
			return c, fmt.Errorf("store redis: needs a url (redis://host:port) or addrs")
		}
	case "cluster":
		if len(s.Addrs) == 0 {
			return c, fmt.Errorf("store cluster: needs the seed nodes' addrs")
		}
		r.Cluster = true
	case "sentinel":
		if s.Master == "" || len(s.Addrs) == 0 {
			return c, fmt.Errorf("store sentinel: needs the master name and the sentinels' addrs (master %q, addrs %q)", s.Master, s.Addrs)
		}
	default:
		return c, fmt.Errorf("store type: unknown %q (want memory, redis, cluster or sentinel)", s.Type)
	}
	if s.Type != "sentinel" {
		r.Master = "" // a master name is what selects Sentinel
	}
	if s.Timeout < 0 {
		return c, at("timeout", fmt.Errorf("store timeout: %s must not be negative", time.Duration(s.Timeout)))
	}
	if err := redis.CheckOptions(*r); err != nil { // the URL and addresses, before anything dials
		return c, fmt.Errorf("store %s: %w", s.Type, err)
	}
	c.Redis = r
	if s.OnError != "" {
		oe, err := core.ParseOnError(s.OnError)
		if err != nil {
			return c, at("on_error", fmt.Errorf("store %w", err))
		}
		c.OnError = oe
	}
	switch s.Mode {
	case "", "exact":
		if s.Sync != 0 {
			return c, at("sync", fmt.Errorf("store sync: %s is only for mode eventual", time.Duration(s.Sync)))
		}
	case "eventual":
		c.Eventual = true
		c.SyncInterval = time.Duration(s.Sync)
		if err := CheckSyncInterval(c.SyncInterval); err != nil {
			return c, at("sync", fmt.Errorf("store sync: %w", err))
		}
	default:
		return c, at("mode", fmt.Errorf("store mode: unknown %q (want exact or eventual)", s.Mode))
	}
	return c, nil
}

// MinSyncInterval is the shortest interval eventual mode syncs at.
const MinSyncInterval = eventual.MinSyncInterval

// CheckSyncInterval reports whether d can be eventual mode's sync interval
// (0 means the default): the eventual store's own rule.
func CheckSyncInterval(d time.Duration) error { return eventual.CheckSyncInterval(d) }
