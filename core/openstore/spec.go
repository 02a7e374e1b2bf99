package openstore

import (
	"fmt"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/spec"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/store/redis"
)

// Spec is a store as configured (in JSON, or written as option lines):
// where counters live and what happens when Redis fails. Config turns it
// into the Config Acquire opens.
type Spec struct {
	// Type is "memory" (the default), "redis" (URL or Addrs), "cluster"
	// (Addrs are seed nodes) or "sentinel" (Master and the Sentinels' Addrs).
	Type string `json:"type,omitempty"`
	// MaxKeys caps the keys tracked in memory (the memory store, the local
	// fallback, eventual mode's local counts); 0 means 1,048,576.
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

// Config validates s and returns the store config it describes. Errors name
// the field and value.
func (s *Spec) Config() (Config, error) {
	var c Config
	if s == nil {
		return c, nil
	}
	if s.MaxKeys < 0 || s.MaxKeys > memory.MaxMaxKeys {
		return c, fmt.Errorf("store max_keys: %d must be between 0 (the default, %d) and %d", s.MaxKeys, memory.DefaultMaxKeys, memory.MaxMaxKeys)
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
		return c, fmt.Errorf("store timeout: %s must not be negative", time.Duration(s.Timeout))
	}
	if err := redis.CheckOptions(*r); err != nil { // the URL and addresses, before anything dials
		return c, fmt.Errorf("store %s: %w", s.Type, err)
	}
	c.Redis = r
	if s.OnError != "" {
		oe, err := core.ParseOnError(s.OnError)
		if err != nil {
			return c, fmt.Errorf("store %w", err)
		}
		c.OnError = oe
	}
	switch s.Mode {
	case "", "exact":
		if s.Sync != 0 {
			return c, fmt.Errorf("store sync: %s is only for mode eventual", time.Duration(s.Sync))
		}
	case "eventual":
		c.Eventual = true
		c.SyncInterval = time.Duration(s.Sync)
		if err := spec.CheckSyncInterval(c.SyncInterval); err != nil {
			return c, fmt.Errorf("store sync: %w", err)
		}
	default:
		return c, fmt.Errorf("store mode: unknown %q (want exact or eventual)", s.Mode)
	}
	return c, nil
}
