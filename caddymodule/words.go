package caddymodule

// The Caddyfile's words for core's and store's specs: each option line as
// the tollgate directive writes it (Caddy JSON fills the same specs
// directly). Errors name the option and the value; UnmarshalCaddyfile
// adds where it was written.

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
)

// parseLimitWords reads a limit written as words: <count>/<window>
// [<algorithm>] [burst <n>] [max_delay <duration>] [name <label>], and
// validates it.
func parseLimitWords(args []string) (config.Limit, error) {
	var s config.Limit
	if len(args) == 0 {
		return s, fmt.Errorf("want <count>/<window>, such as 100/1m")
	}
	rate := args[0]
	count, window, err := algo.ParseRate(rate)
	if err != nil {
		return s, fmt.Errorf("%q: %w", rate, err)
	}
	s.Count, s.Window = count, algo.Duration(window)
	for rest := args[1:]; len(rest) > 0; rest = rest[1:] {
		opt := rest[0]
		switch opt {
		case "burst", "max_delay", "name":
			if len(rest) < 2 {
				return s, fmt.Errorf("%s %s: missing value", rate, opt)
			}
			v := rest[1]
			rest = rest[1:]
			switch opt {
			case "burst":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n < 1 {
					return s, fmt.Errorf("%s burst: %q is not a count of at least 1", rate, v)
				}
				s.Burst = n
			case "max_delay":
				d, err := positiveDuration(rate+" max_delay", v)
				if err != nil {
					return s, err
				}
				s.MaxDelay = algo.Duration(d)
			default:
				s.Name = v
			}
		case "after_response":
			s.AfterResponse = true
		default:
			if _, err := algo.ParseAlgorithm(opt); err != nil {
				return s, fmt.Errorf("%s: %q is neither an algorithm nor burst, max_delay, name or after_response: %w", rate, opt, err)
			}
			s.Algorithm = opt
		}
	}
	return s, nil
}

// setAdaptive reads adaptive option opt with value v as written in an option line:
// controller a name, latency and interval durations, min_samples a count,
// tolerance a multiple, the rest fractions ("0.3" or "30%").
func setAdaptive(s *config.Adaptive, opt, v string) error {
	switch opt {
	case "controller":
		if v != adaptive.ControllerGradient && v != adaptive.ControllerAIMD {
			return fmt.Errorf("%s: %q is not %s or %s", opt, v, adaptive.ControllerGradient, adaptive.ControllerAIMD)
		}
		s.Controller = v
	case "tolerance":
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("%s: %q is not a number", opt, v)
		}
		if f == 0 { // 0 is how a spec leaves it unset
			return fmt.Errorf("%s: %q must be above 1 (leave %s out for its default)", opt, v, opt)
		}
		s.Tolerance = f
	case "latency", "interval":
		d, err := positiveDuration(opt, v)
		if err != nil {
			return err
		}
		*map[string]*algo.Duration{"latency": &s.Latency, "interval": &s.Interval}[opt] = algo.Duration(d)
	case "min_samples":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("%s: %q is not a count of at least 1", opt, v)
		}
		s.MinSamples = n
	case "min", "error_rate", "quantile", "decrease", "increase":
		f, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("%s: %q is not a fraction", opt, v)
		}
		if f == 0 { // 0 is how a spec leaves it unset
			return fmt.Errorf("%s: %q must be above 0 (leave %s out for its default)", opt, v, opt)
		}
		if strings.HasSuffix(v, "%") {
			f /= 100
		}
		*map[string]*float64{"min": &s.Min, "error_rate": &s.ErrorRate, "quantile": &s.Quantile, "decrease": &s.Decrease, "increase": &s.Increase}[opt] = f
	default:
		return fmt.Errorf("unknown option %q (want controller, min, error_rate, latency, tolerance, quantile, interval, decrease, increase or min_samples)", opt)
	}
	return nil
}

// setPlan reads one line of a plans block: <plan> <words of
// parseLimitWords> (repeated to stack limits), or <plan> unlimited.
func setPlan(s *config.Policy, name string, args []string) error {
	i := slices.IndexFunc(s.Plans, func(p config.Plan) bool { return p.Name == name })
	if i < 0 {
		s.Plans, i = append(s.Plans, config.Plan{Name: name}), len(s.Plans)
	}
	plan := &s.Plans[i]
	if len(args) == 1 && args[0] == "unlimited" {
		plan.Unlimited = true
		return nil
	}
	l, err := parseLimitWords(args)
	if err != nil {
		return fmt.Errorf("policy %q plan %q limit %w", s.Name, name, err)
	}
	plan.Limits = append(plan.Limits, l)
	return nil
}

// setCharge reads one line of a policy's charge block: status <code or
// class or range...>, header <name> [<value>...], cost_header <name>
// [<entry>], usage <figure>, input_cost <price>, output_cost <price>,
// cost <n>.
func setCharge(c *config.Charge, opt string, args []string) error {
	switch opt {
	case "status":
		if len(args) == 0 {
			return fmt.Errorf("status: want codes (401), classes (4xx) or ranges (500-599)")
		}
		c.Status = append(c.Status, args...)
	case "header":
		if len(args) == 0 {
			return fmt.Errorf("header: want a header name, then any values it must have")
		}
		c.Header, c.Values = args[0], args[1:]
	case "cost_header":
		if len(args) == 0 || len(args) > 2 {
			return fmt.Errorf("cost_header: want a header name, then optionally the entry to take from name=value lists")
		}
		c.CostHeader = args[0]
		if len(args) == 2 {
			c.CostEntry = args[1]
		}
	case "cost":
		v, err := oneArg(opt, args)
		if err != nil {
			return err
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("cost: %q is not a whole number", v)
		}
		c.Cost = &n
	case "usage":
		v, err := oneArg(opt, args)
		if err != nil {
			return err
		}
		c.Usage = v
	case "input_cost", "output_cost":
		v, err := oneArg(opt, args)
		if err != nil {
			return err
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not a price of a million tokens", opt, v)
		}
		if opt == "input_cost" {
			c.InputCost = &f
		} else {
			c.OutputCost = &f
		}
	default:
		return fmt.Errorf("unknown option %q (want status, header, cost_header, usage, input_cost, output_cost or cost)", opt)
	}
	return nil
}

// setPolicy reads one option line of a policy: key <template>, empty_key
// skip|shared, limit <words of parseLimitWords>, cost <n>, shadow. The
// adaptive block is read with setAdaptive. Errors name the policy, the
// option and the value.
func setPolicy(s *config.Policy, opt string, args []string) error {
	one := func() (string, error) { return oneArg(opt, args) }
	var err error
	switch opt {
	case "key":
		s.Key, err = one()
	case "empty_key":
		s.EmptyKey, err = one()
	case "limit":
		l, lerr := parseLimitWords(args)
		if lerr != nil {
			return fmt.Errorf("policy %q limit %w", s.Name, lerr)
		}
		s.Limits = append(s.Limits, l)
	case "cost":
		var v string
		if v, err = one(); err == nil {
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil {
				err = fmt.Errorf("policy %q cost: %q is not a whole number", s.Name, v)
			}
			s.Cost = n
		}
	case "shadow":
		if len(args) > 0 {
			return fmt.Errorf("shadow: unexpected %q", args[0])
		}
		s.Shadow = true
	case "clear_keys":
		if len(args) > 0 {
			return fmt.Errorf("clear_keys: unexpected %q", args[0])
		}
		s.ClearKeys = true
	case "penalty":
		if len(args) != 2 {
			return fmt.Errorf("policy %q penalty: want <denials>/<window> <duration>, such as 5/10m 1h", s.Name)
		}
		n, within, perr := algo.ParseRate(args[0])
		if perr != nil {
			return fmt.Errorf("policy %q penalty: %w", s.Name, perr)
		}
		box, perr := positiveDuration(fmt.Sprintf("policy %q penalty", s.Name), args[1])
		if perr != nil {
			return perr
		}
		s.Penalty = &config.Penalty{Denials: n, Within: algo.Duration(within), For: algo.Duration(box)}
	case "priority":
		s.Priority, err = one()
	case "reserve":
		// reserve <share> for <level>: "reserve 20% for 1"
		if len(args) != 3 || args[1] != "for" {
			return fmt.Errorf("policy %q reserve: want <share> for <priority>, such as 20%% for 1", s.Name)
		}
		share, perr := strconv.ParseFloat(strings.TrimSuffix(args[0], "%"), 64)
		if strings.HasSuffix(args[0], "%") {
			share /= 100
		}
		level, lerr := strconv.Atoi(args[2])
		if perr != nil {
			return fmt.Errorf("policy %q reserve: %q is not a share such as 0.2 or 20%%", s.Name, args[0])
		}
		if lerr != nil {
			return fmt.Errorf("policy %q reserve: %q is not a whole priority", s.Name, args[2])
		}
		s.Reserve = &config.Reserve{Share: share, For: level}
	case "plan":
		s.Plan, err = one()
	case "default_plan":
		s.DefaultPlan, err = one()
	default:
		return fmt.Errorf("policy %q: unknown option %q (want match, key, empty_key, limit, cost, shadow, adaptive, plan, plans, default_plan, clear_keys, charge, penalty, priority or reserve)", s.Name, opt)
	}
	return err
}

// oneArg returns the single value of option opt written as words, with an
// error naming the option when it is missing or followed by another.
func oneArg(opt string, args []string) (string, error) {
	switch len(args) {
	case 0:
		return "", fmt.Errorf("%s: missing value", opt)
	case 1:
		return args[0], nil
	}
	return "", fmt.Errorf("unexpected %q after the value %q", args[1], args[0])
}

// parseStoreWords reads a store written as words: memory [max_keys <n>],
// redis <url>, cluster <addr...> or sentinel <master> <addr...>. Options of
// a Redis store follow with setStore.
func parseStoreWords(args []string) (*config.Store, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("store: want memory, redis <url>, cluster <addr...> or sentinel <master> <addr...>")
	}
	s := &config.Store{Type: args[0]}
	rest := args[1:]
	switch s.Type {
	case "memory":
		if len(rest) == 2 && rest[0] == "max_keys" {
			n, err := storeCount("max_keys", rest[1])
			if err != nil {
				return nil, fmt.Errorf("store memory %w", err)
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

// setStore reads one option line of a Redis store: timeout <duration>, on_error
// local|allow|deny|fail, mode exact|eventual [sync <duration>], max_keys,
// pool_size and db <n>, prefix, username, password and sentinel_password
// <string>, tls [<server name>], tls_ca <PEM file>.
func setStore(s *config.Store, opt string, args []string) error {
	if s.Type == "memory" {
		return fmt.Errorf("store memory: takes no block (got %q)", opt)
	}
	one := func() (string, error) { return oneArg(opt, args) }
	switch opt {
	case "timeout":
		v, err := one()
		if err != nil {
			return err
		}
		d, err := positiveDuration("store timeout", v)
		if err != nil {
			return err
		}
		s.Timeout = algo.Duration(d)
	case "on_error":
		v, err := one()
		if err != nil {
			return err
		}
		s.OnError = v
	case "mode":
		switch {
		case len(args) == 1 && (args[0] == "exact" || args[0] == "eventual"):
		case len(args) == 3 && args[0] == "eventual" && args[1] == "sync":
			d, err := positiveDuration("store mode eventual sync", args[2])
			if err != nil {
				return err
			}
			s.Sync = algo.Duration(d)
		default:
			return fmt.Errorf("store mode: want exact, eventual or eventual sync <duration>, got %q", args)
		}
		s.Mode = args[0]
	case "max_keys", "pool_size", "db":
		v, err := one()
		if err != nil {
			return err
		}
		n, err := storeCount(opt, v)
		if err != nil {
			return fmt.Errorf("store %w", err)
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

// setResponse reads one option line: headers, body, status, jitter or log_denials
// and its value; errors name the option and the value.
func setResponse(s *config.Response, opt, v string) error {
	switch opt {
	case "headers":
		s.Headers = v
	case "body":
		s.Body = v
	case "status":
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("status: %q is not a whole number", v)
		}
		s.Status = n
	case "jitter":
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("jitter: %q is not a fraction between 0 and 1", v)
		}
		s.Jitter = f
	case "log_denials":
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("log_denials: %q is not a number of lines per second", v)
		}
		s.LogDenials = n
	default:
		return fmt.Errorf("unknown option %q", opt)
	}
	return nil
}

// storeCount reads the value of a store's count option (max_keys,
// pool_size, db): a whole number, 0 only for db (0 is how a spec leaves
// the others unset, so writing it would be read as leaving them out), and
// max_keys's range is the store's, checked with the whole config.
func storeCount(opt, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a whole number", opt, v)
	}
	if n < 0 {
		return 0, fmt.Errorf("%s: %d must not be negative", opt, n)
	}
	if n == 0 && opt != "db" {
		return 0, fmt.Errorf("%s: 0 must be at least 1 (leave %s out for its default)", opt, opt)
	}
	return n, nil
}

// positiveDuration reads a duration above 0 (algo.ParseDuration's
// grammar, in its words), for the option named opt.
func positiveDuration(opt, v string) (time.Duration, error) {
	d, err := algo.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", opt, err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s: %q must be above 0", opt, v)
	}
	return d, nil
}
