package caddymodule

import (
	"errors"
	"fmt"
	"slices"
	"strings"

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
// (config.Store, config.Policy, config.Adaptive): this reads their words,
// and config.Compile checks the whole, as Provision compiles it; its
// errors get the Caddyfile line their field was written on.
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
//	        charge { status <code|class|range...>, header <name> [<value>...], cost_header <name> [<entry>] | usage total_tokens|prompt_tokens|completion_tokens, cost <n> }
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
	w := written{}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "store":
			if h.Store != nil {
				return d.Err("store: given twice")
			}
			w.note("store", d)
			s, err := parseStoreWords(d.RemainingArgs())
			if err != nil {
				return d.Err(err.Error())
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				w.note("store."+d.Val(), d)
				if d.Val() == "mode" {
					w.note("store.sync", d) // written in the mode's line
				}
				if err := setStore(s, d.Val(), d.RemainingArgs()); err != nil {
					return d.Err(err.Error())
				}
			}
			h.Store = s
		case "policy":
			p, err := parsePolicy(d, w, fmt.Sprintf("policies[%d]", len(h.Policies)))
			if err != nil {
				return err
			}
			h.Policies = append(h.Policies, p)
		case "headers", "body", "status", "jitter", "log_denials":
			w.note(opt, d)
			v, err := lineArg(d)
			if err != nil {
				return err
			}
			if err := setResponse(&h.Response, opt, v); err != nil {
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
	// The whole config is checked as Provision compiles it, by the one
	// maker of gate configs; its error is said at the line it was written.
	compiled, err := config.Compile(h.setup("caddyfile"))
	var ce *config.Error
	switch {
	case len(h.Policies) == 0 && (err == nil || errors.As(err, &ce) && ce.Field == "policies"):
		return d.Err("tollgate: needs at least one policy block")
	case errors.As(err, &ce):
		return w.err(ce, d)
	case err != nil:
		return d.Err(err.Error())
	}
	compiled.Release()
	return nil
}

// written remembers where each part of a tollgate block was written, by
// its path in the config ("policies[1].limits[0]", "store.timeout",
// "status"), to say where an error of the whole config is.
type written map[string]caddyfile.Token

// note remembers that path was written at d's token.
func (w written) note(path string, d *caddyfile.Dispenser) { w[path] = d.Token() }

// err returns ce at the line its field was written, or the nearest part
// around it that was (a limit's policy, say); at d when none was.
func (w written) err(ce *config.Error, d *caddyfile.Dispenser) error {
	path := ce.Field
	if ce.Policy >= 0 {
		path = strings.TrimSuffix(fmt.Sprintf("policies[%d].%s", ce.Policy, ce.Field), ".")
	}
	for ; path != ""; path = parentPath(path) {
		if tok, ok := w[path]; ok {
			at := caddyfile.NewDispenser([]caddyfile.Token{tok})
			at.Next()
			return at.Err(ce.Error())
		}
	}
	return d.Err(ce.Error())
}

// parentPath is path without its last step: a.b[1] for a.b[1].c, a.b for
// a.b[1], "" for a.
func parentPath(path string) string {
	if i := strings.LastIndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return ""
}

func parsePolicy(d *caddyfile.Dispenser, w written, path string) (*PolicyConfig, error) {
	p := new(PolicyConfig)
	w.note(path, d)
	if !d.NextArg() {
		return nil, d.Err("policy: want a name")
	}
	p.Name = d.Val()
	if d.NextArg() {
		return nil, d.Errf("policy %q: unexpected argument %q (options go in its block)", p.Name, d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		w.note(path+"."+opt, d)
		switch opt {
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
			p.Adaptive = a
		case "charge":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			c := new(config.Charge)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				// Compile says which of the charge's options is wrong.
				opt := d.Val()
				w.note(path+".charge."+opt, d)
				switch opt {
				case "header":
					w.note(path+".charge.values", d)
				case "cost_header":
					w.note(path+".charge.cost_entry", d)
				}
				if err := setCharge(c, opt, d.RemainingArgs()); err != nil {
					return nil, d.Errf("policy %q charge %v", p.Name, err)
				}
			}
			p.Charge = c
		case "plans":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				name := d.Val()
				if err := setPlan(&p.Policy, name, d.RemainingArgs()); err != nil {
					return nil, d.Err(err.Error())
				}
				i := slices.IndexFunc(p.Plans, func(plan config.Plan) bool { return plan.Name == name })
				plan := fmt.Sprintf("%s.plans[%d]", path, i)
				if _, ok := w[plan]; !ok {
					w.note(plan, d)
				}
				if n := len(p.Plans[i].Limits); n > 0 {
					w.note(fmt.Sprintf("%s.limits[%d]", plan, n-1), d)
				}
			}
		default:
			if err := setPolicy(&p.Policy, opt, d.RemainingArgs()); err != nil {
				return nil, d.Err(err.Error())
			}
			if opt == "limit" {
				w.note(fmt.Sprintf("%s.limits[%d]", path, len(p.Limits)-1), d)
			}
			if template := map[string]string{"key": p.Key, "plan": p.Plan, "priority": p.Priority}[opt]; template != "" {
				if _, err := parseKeyTemplate(template); err != nil {
					return nil, d.Errf("policy %q %s: %v", p.Name, opt, err)
				}
			}
		}
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
