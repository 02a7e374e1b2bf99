package store

import (
	"fmt"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/core"
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
	// SentinelUsername and SentinelPassword authenticate to the Sentinels.
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// TLS turns on TLS; TLSServerName overrides the verified name;
	// TLSSkipVerify turns verification off.
	TLS           bool   `json:"tls,omitempty"`
	TLSServerName string `json:"tls_server_name,omitempty"`
	TLSSkipVerify bool   `json:"tls_skip_verify,omitempty"`
	// TLSCA is a PEM file of the CAs that verify the server (default: the
	// system's).
	TLSCA string `json:"tls_ca,omitempty"`
	// Timeout bounds one Redis decision (dial, write, read); default 500ms.
	Timeout core.Duration `json:"timeout,omitempty"`
	// PoolSize is the connections per Redis node; 0 means go-redis's default.
	PoolSize int `json:"pool_size,omitempty"`
	// Prefix starts every Redis key; default "tollgate:".
	Prefix string `json:"prefix,omitempty"`
	// OnError is what happens while Redis fails: "local" (default: limit on
	// this node alone), "allow", "deny" or "fail" (the adapter answers its
	// error status).
	OnError string `json:"on_error,omitempty"`
	// Mode is "exact" (default: every decision in Redis) or "eventual"
	// (decide locally, sync counts every Sync).
	Mode string `json:"mode,omitempty"`
	// Sync is eventual mode's sync interval; default 1s, at least 20ms.
	Sync core.Duration `json:"sync,omitempty"`
}

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
	r := &RedisConfig{
		URL: s.URL, Addrs: s.Addrs, Username: s.Username, Password: s.Password, DB: s.DB,
		SentinelUsername: s.SentinelUsername, SentinelPassword: s.SentinelPassword,
		TLS: s.TLS || s.TLSCA != "", TLSServerName: s.TLSServerName, TLSInsecureSkipVerify: s.TLS && s.TLSSkipVerify, TLSCA: s.TLSCA,
		Timeout: time.Duration(s.Timeout), PoolSize: s.PoolSize, Prefix: s.Prefix,
	}
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
		r.MasterName = s.Master
	default:
		return c, fmt.Errorf("store type: unknown %q (want memory, redis, cluster or sentinel)", s.Type)
	}
	if s.Timeout < 0 {
		return c, fmt.Errorf("store timeout: %s must not be negative", time.Duration(s.Timeout))
	}
	if err := redis.CheckOptions(r.options()); err != nil { // the URL and addresses, before anything dials
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
		if err := core.CheckSyncInterval(c.SyncInterval); err != nil {
			return c, fmt.Errorf("store sync: %w", err)
		}
	default:
		return c, fmt.Errorf("store mode: unknown %q (want exact or eventual)", s.Mode)
	}
	return c, nil
}

// ParseSpecArgs reads a store written as words: memory [max_keys <n>],
// redis <url>, cluster <addr...> or sentinel <master> <addr...>. Options of
// a Redis store follow with Spec.Set.
func ParseSpecArgs(args []string) (*Spec, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("store: want memory, redis <url>, cluster <addr...> or sentinel <master> <addr...>")
	}
	s := &Spec{Type: args[0]}
	rest := args[1:]
	switch s.Type {
	case "memory":
		if len(rest) == 2 && rest[0] == "max_keys" {
			n, err := strconv.Atoi(rest[1])
			if err != nil || n < 1 || n > memory.MaxMaxKeys {
				return nil, fmt.Errorf("store memory max_keys: %q is not a count between 1 and %d", rest[1], memory.MaxMaxKeys)
			}
			s.MaxKeys = n
		} else if len(rest) != 0 {
			return nil, fmt.Errorf("store memory: unexpected %q (want max_keys <n>)", rest)
		}
	case "redis":
		if len(rest) != 1 {
			return nil, fmt.Errorf("store redis: want one URL (redis://host:port/db), got %d arguments", len(rest))
		}
		s.URL = rest[0]
	case "cluster":
		if len(rest) == 0 {
			return nil, fmt.Errorf("store cluster: want the seed nodes' host:port addresses")
		}
		s.Addrs = rest
	case "sentinel":
		if len(rest) < 2 {
			return nil, fmt.Errorf("store sentinel: want the master name and the sentinels' host:port addresses")
		}
		s.Master, s.Addrs = rest[0], rest[1:]
	default:
		return nil, fmt.Errorf("store: unknown type %q (want memory, redis, cluster or sentinel)", s.Type)
	}
	return s, nil
}

// Set reads one option line of a Redis store: timeout <duration>, on_error
// local|allow|deny|fail, mode exact|eventual [sync <duration>], max_keys,
// pool_size and db <n>, prefix, username, password and sentinel_password
// <string>, tls [<server name>], tls_ca <PEM file>.
func (s *Spec) Set(opt string, args []string) error {
	if s.Type == "memory" {
		return fmt.Errorf("store memory: takes no block (got %q)", opt)
	}
	one := func() (string, error) { return core.OneArg(opt, args) }
	switch opt {
	case "timeout":
		v, err := one()
		if err != nil {
			return err
		}
		d, err := core.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("store timeout: %q is not a positive duration", v)
		}
		s.Timeout = core.Duration(d)
	case "on_error":
		v, err := one()
		if err != nil {
			return err
		}
		if _, err := core.ParseOnError(v); err != nil {
			return fmt.Errorf("store %w", err)
		}
		s.OnError = v
	case "mode":
		switch {
		case len(args) == 1 && (args[0] == "exact" || args[0] == "eventual"):
		case len(args) == 3 && args[0] == "eventual" && args[1] == "sync":
			d, err := core.ParseDuration(args[2])
			if err != nil || d <= 0 {
				return fmt.Errorf("store mode eventual sync: %q is not a positive duration", args[2])
			}
			if err := core.CheckSyncInterval(d); err != nil {
				return fmt.Errorf("store sync: %w", err)
			}
			s.Sync = core.Duration(d)
		default:
			return fmt.Errorf("store mode: want exact, eventual or eventual sync <duration>, got %q", args)
		}
		s.Mode = args[0]
	case "max_keys", "pool_size", "db":
		v, err := one()
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("store %s: %q is not a whole number", opt, v)
		}
		if n < 0 {
			return fmt.Errorf("store %s: %d must not be negative", opt, n)
		}
		if n == 0 && opt != "db" { // 0 is how a spec leaves it unset
			return fmt.Errorf("store %s: 0 must be at least 1 (leave %s out for its default)", opt, opt)
		}
		if opt == "max_keys" && n > memory.MaxMaxKeys {
			return fmt.Errorf("store max_keys: %d must be at most %d", n, memory.MaxMaxKeys)
		}
		*map[string]*int{"max_keys": &s.MaxKeys, "pool_size": &s.PoolSize, "db": &s.DB}[opt] = n
	case "prefix", "username", "password", "sentinel_password", "tls_ca":
		v, err := one()
		if err != nil {
			return err
		}
		*map[string]*string{"prefix": &s.Prefix, "username": &s.Username, "password": &s.Password,
			"sentinel_password": &s.SentinelPassword, "tls_ca": &s.TLSCA}[opt] = v
	case "tls":
		if len(args) > 1 {
			return fmt.Errorf("tls: unexpected %q", args[1])
		}
		s.TLS = true
		if len(args) == 1 {
			s.TLSServerName = args[0]
		}
	default:
		return fmt.Errorf("store %s: unknown option %q", s.Type, opt)
	}
	return nil
}
