package caddymodule

import (
	"slices"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core/config"
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

// UnmarshalCaddyfile reads the tollgate directive. The options are core's
// (config.Store, config.Policy, config.Adaptive), which check them; this
// adds the Caddyfile line to their errors.
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
//	        empty_key client|skip|shared
//	        limit <count>/<window> [<algorithm>] [burst <n>] [max_delay <duration>] [name <label>] [after_response]
//	        cost <n>
//	        shadow
//	        adaptive { controller gradient|aimd, min|error_rate|quantile|decrease|increase <fraction>, tolerance <multiple>, latency|interval <duration>, min_samples <n> }
//	        plan <string with placeholders>
//	        plans { <plan> <count>/<window> [...] | <plan> unlimited }
//	        default_plan <plan>
//	        charge { status <code|class|range...>, header <name> [<value>...], cost_header <name> [<entry>], cost <n> }
//	        penalty <denials>/<window> <duration>
//	        priority <string with placeholders>
//	        reserve <share> for <priority>
//	    }
//	    headers ietf|xratelimit|both|none|kong
//	    status <code>
//	    body <text>
//	    jitter <fraction>
//	    log_denials <lines per second>
//	    handle_errors
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "store":
			if h.Store != nil {
				return d.Err("store: given twice")
			}
			s, err := parseStoreWords(d.RemainingArgs())
			if err != nil {
				return d.Err(err.Error())
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if err := setStore(s, d.Val(), d.RemainingArgs()); err != nil {
					return d.Err(err.Error())
				}
			}
			if _, err := s.Config(); err != nil {
				return d.Err(err.Error())
			}
			h.Store = s
		case "policy":
			p, err := parsePolicy(d)
			if err != nil {
				return err
			}
			if i := slices.IndexFunc(h.Policies, func(q *PolicyConfig) bool { return q.Name == p.Name }); i >= 0 {
				return d.Errf("policy %q: name used twice", p.Name)
			}
			if err := h.Store.CheckPolicy(&p.Policy); err != nil { // a store given after its policies: Provision checks
				return d.Err(err.Error())
			}
			h.Policies = append(h.Policies, p)
		case "headers", "body", "status", "jitter", "log_denials":
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			if err := setResponse(&h.ResponseSpec, opt, v); err != nil {
				return d.Err(err.Error())
			}
		case "handle_errors":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.HandleErrors = true
		default:
			return d.Errf("unknown subdirective %q (want store, policy, headers, status, body, jitter, log_denials or handle_errors)", opt)
		}
	}
	if len(h.Policies) == 0 {
		return d.Err("tollgate: needs at least one policy block")
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
		switch opt := d.Val(); opt {
		case "match":
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return nil, err
			}
			p.MatcherSetsRaw = append(p.MatcherSetsRaw, set)
		case "adaptive":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			a := new(config.Adaptive)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				opt := d.Val()
				v, err := lineArg(d)
				if err != nil {
					return nil, err
				}
				if err := setAdaptive(a, opt, v); err != nil {
					return nil, d.Errf("policy %q adaptive %v", p.Name, err)
				}
			}
			if err := a.Options().Validate(); err != nil {
				return nil, d.Errf("policy %q %v", p.Name, err)
			}
			p.Adaptive = a
		case "charge":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			c := new(config.Charge)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if err := setCharge(c, d.Val(), d.RemainingArgs()); err != nil {
					return nil, d.Errf("policy %q charge %v", p.Name, err)
				}
			}
			if _, err := c.Compile(); err != nil {
				return nil, d.Errf("policy %q %v", p.Name, err)
			}
			p.Charge = c
		case "plans":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if err := setPlan(&p.Policy, d.Val(), d.RemainingArgs()); err != nil {
					return nil, d.Err(err.Error())
				}
			}
		default:
			if err := setPolicy(&p.Policy, opt, d.RemainingArgs()); err != nil {
				return nil, d.Err(err.Error())
			}
			if template := map[string]string{"key": p.Key, "plan": p.Plan, "priority": p.Priority}[opt]; template != "" {
				if _, err := parseKeyTemplate(template); err != nil {
					return nil, d.Errf("policy %q %s: %v", p.Name, opt, err)
				}
			}
		}
	}
	if len(p.Limits) == 0 && len(p.Plans) == 0 {
		return nil, d.Errf("policy %q: needs at least one limit <count>/<window>, or plans", p.Name)
	}
	if _, err := p.Check(); err != nil {
		return nil, d.Err(err.Error())
	}
	return p, nil
}

// lineArg reads the single argument of an option that ends its line.
func lineArg(d *caddyfile.Dispenser) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s: missing value", opt)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("unexpected %q after the value %q", d.Val(), v)
	}
	return v, nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
