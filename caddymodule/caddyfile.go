package caddymodule

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("tollgate", parseCaddyfile)
	// Rate limiting comes before authentication, so a flood of bad
	// credentials is limited too, and no `order` option is needed.
	httpcaddyfile.RegisterDirectiveOrder("tollgate", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var t Handler
	err := t.UnmarshalCaddyfile(h.Dispenser)
	return &t, err
}

// UnmarshalCaddyfile reads the tollgate directive:
//
//	tollgate [<matcher>] {
//	    store memory [max_keys <n>]
//	    store redis <url> | cluster <addr...> | sentinel <master> <addr...> {
//	        timeout <duration>
//	        on_error local|allow|deny|fail
//	        mode exact|eventual [sync <duration>]
//	        max_keys <n>
//	        pool_size <n>
//	        prefix <string>
//	        username <user>
//	        password <password>
//	        sentinel_password <password>
//	        db <n>
//	        tls [<server name>]
//	    }
//	    policy <name> {
//	        match { <request matchers> }
//	        key <string with placeholders>
//	        empty_key skip|shared
//	        limit <count>/<window> [<algorithm>] [burst <n>] [max_delay <duration>] [name <label>]
//	        cost <n>
//	        shadow
//	    }
//	    headers ietf|xratelimit|both|none
//	    status <code>
//	    body <text>
//	    jitter <fraction>
//	    handle_errors
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "store":
			if h.Store != nil {
				return d.Err("store: given twice")
			}
			h.Store = new(StoreConfig)
			if err := parseStore(d, h.Store); err != nil {
				return err
			}
		case "policy":
			p, err := parsePolicy(d)
			if err != nil {
				return err
			}
			h.Policies = append(h.Policies, p)
		case "headers":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			if _, err := core.ParseHeaderStyle(v); err != nil {
				return d.Err(err.Error())
			}
			h.Headers = v
		case "status":
			n, err := intArg(d, "status")
			if err != nil {
				return err
			}
			if err := core.CheckDenyStatus(n); err != nil {
				return d.Errf("status: %v", err)
			}
			h.Status = n
		case "body":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			h.Body = v
		case "jitter":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return d.Errf("jitter: %q is not a fraction between 0 and 1", v)
			}
			if err := core.CheckJitter(f); err != nil {
				return d.Errf("jitter: %v", err)
			}
			h.Jitter = f
		case "handle_errors":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.HandleErrors = true
		default:
			return d.Errf("unknown subdirective %q (want store, policy, headers, status, body, jitter or handle_errors)", d.Val())
		}
	}
	if len(h.Policies) == 0 {
		return d.Err("tollgate: needs at least one policy block")
	}
	return nil
}

func parseStore(d *caddyfile.Dispenser, s *StoreConfig) error {
	if !d.NextArg() {
		return d.Err("store: want memory, redis <url>, cluster <addr...> or sentinel <master> <addr...>")
	}
	s.Type = d.Val()
	args := d.RemainingArgs()
	switch s.Type {
	case "memory":
		if len(args) == 2 && args[0] == "max_keys" {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 0 {
				return d.Errf("store memory max_keys: %q is not a count", args[1])
			}
			s.MaxKeys = n
		} else if len(args) != 0 {
			return d.Errf("store memory: unexpected %q (want max_keys <n>)", args)
		}
	case "redis":
		if len(args) != 1 {
			return d.Errf("store redis: want one URL (redis://host:port/db), got %d arguments", len(args))
		}
		s.URL = args[0]
	case "cluster":
		if len(args) == 0 {
			return d.Err("store cluster: want the seed nodes' host:port addresses")
		}
		s.Addrs = args
	case "sentinel":
		if len(args) < 2 {
			return d.Err("store sentinel: want the master name and the sentinels' host:port addresses")
		}
		s.Master, s.Addrs = args[0], args[1:]
	default:
		return d.Errf("store: unknown type %q (want memory, redis, cluster or sentinel)", s.Type)
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if s.Type == "memory" {
			return d.Errf("store memory: takes no block (got %q)", d.Val())
		}
		opt := d.Val()
		switch opt {
		case "timeout":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("store timeout: %q is not a positive duration", v)
			}
			s.Timeout = caddy.Duration(dur)
		case "on_error":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			if _, err := core.ParseOnError(v); err != nil {
				return d.Errf("store %v", err)
			}
			s.OnError = v
		case "mode":
			args := d.RemainingArgs()
			switch {
			case len(args) == 1 && (args[0] == "exact" || args[0] == "eventual"):
			case len(args) == 3 && args[0] == "eventual" && args[1] == "sync":
				dur, err := caddy.ParseDuration(args[2])
				if err != nil || dur <= 0 {
					return d.Errf("store mode eventual sync: %q is not a positive duration", args[2])
				}
				if err := core.CheckSyncInterval(dur); err != nil {
					return d.Errf("store sync: %v", err)
				}
				s.Sync = caddy.Duration(dur)
			default:
				return d.Errf("store mode: want exact, eventual or eventual sync <duration>, got %q", args)
			}
			s.Mode = args[0]
		case "max_keys", "pool_size", "db":
			n, err := intArg(d, "store "+opt)
			if err != nil {
				return err
			}
			if n < 0 {
				return d.Errf("store %s: %d must not be negative", opt, n)
			}
			switch opt {
			case "max_keys":
				s.MaxKeys = n
			case "pool_size":
				s.PoolSize = n
			default:
				s.DB = n
			}
		case "prefix", "username", "password", "sentinel_password":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			switch opt {
			case "prefix":
				s.Prefix = v
			case "username":
				s.Username = v
			case "password":
				s.Password = v
			default:
				s.SentinelPassword = v
			}
		case "tls":
			s.TLS = true
			if d.NextArg() {
				s.TLSServerName = d.Val()
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("store %s: unknown option %q", s.Type, opt)
		}
	}
	return nil
}

func parsePolicy(d *caddyfile.Dispenser) (*PolicyConfig, error) {
	p := new(PolicyConfig)
	if !d.NextArg() {
		return nil, d.Err("policy: want a name")
	}
	p.Name = d.Val()
	if d.NextArg() {
		return nil, d.Errf("policy %q: unexpected argument %q (options go in its block)", p.Name, d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "match":
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return nil, err
			}
			p.MatcherSetsRaw = append(p.MatcherSetsRaw, set)
		case "key":
			v, err := lineArg(d)
			if err != nil {
				return nil, err
			}
			p.Key = v
		case "empty_key":
			v, err := lineArg(d)
			if err != nil {
				return nil, err
			}
			if _, err := core.ParseEmptyKey(v); err != nil {
				return nil, d.Errf("policy %q empty_key: %v", p.Name, err)
			}
			p.EmptyKey = v
		case "limit":
			l, err := parseLimit(d, p.Name)
			if err != nil {
				return nil, err
			}
			p.Limits = append(p.Limits, l)
		case "cost":
			n, err := intArg(d, "policy "+strconv.Quote(p.Name)+" cost")
			if err != nil {
				return nil, err
			}
			if err := core.CheckCost(int64(n)); err != nil {
				return nil, d.Errf("policy %q cost: %v", p.Name, err)
			}
			p.Cost = int64(n)
		case "shadow":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			p.Shadow = true
		case "adaptive":
			a, err := parseAdaptive(d, p.Name)
			if err != nil {
				return nil, err
			}
			p.Adaptive = a
		default:
			return nil, d.Errf("policy %q: unknown option %q (want match, key, empty_key, limit, cost, shadow or adaptive)", p.Name, d.Val())
		}
	}
	if len(p.Limits) == 0 {
		return nil, d.Errf("policy %q: needs at least one limit <count>/<window>", p.Name)
	}
	return p, nil
}

// parseAdaptive reads `adaptive { min <fraction> error_rate <fraction>
// latency <duration> quantile <fraction> interval <duration> decrease
// <fraction> increase <fraction> min_samples <n> }`; every option is
// optional, and so is the block.
func parseAdaptive(d *caddyfile.Dispenser, policy string) (*AdaptiveConfig, error) {
	a := new(AdaptiveConfig)
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		v, err := lineArg(d)
		if err != nil {
			return nil, err
		}
		field := "policy " + strconv.Quote(policy) + " adaptive " + opt
		switch opt {
		case "latency", "interval":
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return nil, d.Errf("%s: %q is not a positive duration", field, v)
			}
			if opt == "latency" {
				a.Latency = caddy.Duration(dur)
			} else {
				a.Interval = caddy.Duration(dur)
			}
		case "min_samples":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return nil, d.Errf("%s: %q is not a count of at least 1", field, v)
			}
			a.MinSamples = n
		case "min", "error_rate", "quantile", "decrease", "increase":
			f, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
			if err != nil {
				return nil, d.Errf("%s: %q is not a fraction", field, v)
			}
			if strings.HasSuffix(v, "%") {
				f /= 100
			}
			*map[string]*float64{"min": &a.Min, "error_rate": &a.ErrorRate, "quantile": &a.Quantile, "decrease": &a.Decrease, "increase": &a.Increase}[opt] = f
		default:
			return nil, d.Errf("policy %q adaptive: unknown option %q (want min, error_rate, latency, quantile, interval, decrease, increase or min_samples)", policy, opt)
		}
	}
	if err := a.options().Validate(); err != nil {
		return nil, d.Errf("policy %q %v", policy, err)
	}
	return a, nil
}

// parseLimit reads `limit <count>/<window> [<algorithm>] [burst <n>]
// [max_delay <duration>] [name <label>]` and checks it as the core will.
func parseLimit(d *caddyfile.Dispenser, policy string) (LimitConfig, error) {
	var l LimitConfig
	if !d.NextArg() {
		return l, d.Errf("policy %q limit: want <count>/<window>, such as 100/1m", policy)
	}
	rate := d.Val()
	count, window, err := core.ParseRate(rate)
	if err != nil {
		return l, d.Errf("policy %q limit %q: %v", policy, rate, err)
	}
	l.Count, l.Window = count, caddy.Duration(window)
	for d.NextArg() {
		switch opt := d.Val(); opt {
		case "burst":
			v, err := oneArg(d)
			if err != nil {
				return l, err
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return l, d.Errf("policy %q limit %s burst: %q is not a count of at least 1", policy, rate, v)
			}
			l.Burst = n
		case "max_delay":
			v, err := oneArg(d)
			if err != nil {
				return l, err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return l, d.Errf("policy %q limit %s max_delay: %q is not a positive duration", policy, rate, v)
			}
			l.MaxDelay = caddy.Duration(dur)
		case "name":
			v, err := oneArg(d)
			if err != nil {
				return l, err
			}
			l.Name = v
		default:
			if _, err := core.ParseAlgorithm(opt); err != nil {
				return l, d.Errf("policy %q limit %s: %q is neither an algorithm nor burst, max_delay or name: %v", policy, rate, opt, err)
			}
			l.Algorithm = opt
		}
	}
	if _, err := l.limit(); err != nil {
		return l, d.Errf("policy %q limit %s: %v", policy, rate, err)
	}
	return l, nil
}

// lineArg reads the single argument of an option that ends its line.
func lineArg(d *caddyfile.Dispenser) (string, error) {
	v, err := oneArg(d)
	if err == nil && d.NextArg() {
		return "", d.Errf("unexpected %q after the value %q", d.Val(), v)
	}
	return v, err
}

// oneArg reads the single argument of the current option.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s: missing value", opt)
	}
	return d.Val(), nil
}

func intArg(d *caddyfile.Dispenser, field string) (int, error) {
	v, err := lineArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s: %q is not a whole number", field, v)
	}
	return n, nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
