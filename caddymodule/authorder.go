package caddymodule

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"
)

func init() {
	caddy.RegisterModule(authOrder{})
}

// authOrder is a Caddy app that no config names: each tollgate handler
// asks for it, so Caddy starts it with the config's apps, once every
// module is provisioned, and it then refuses the config when a policy
// reads an authentication placeholder ({http.auth.*}) that an
// authentication handler sets only after tollgate has decided. Caddy
// orders tollgate before basic_auth in a site block, so the placeholder
// would be empty on every request, and every user would share the client
// address's bucket. A handler cannot see its siblings while it is
// provisioned; an app started after them can.
type authOrder struct {
	ctx caddy.Context
}

// CaddyModule returns the Caddy module information.
func (authOrder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "tollgate", New: func() caddy.Module { return new(authOrder) }}
}

// Provision keeps the context, to find the http app at Start.
func (a *authOrder) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	return nil
}

// Start checks every server's routes (caddy.App).
func (a *authOrder) Start() error {
	app, err := a.ctx.AppIfConfigured("http")
	if err != nil {
		return nil // no http app: no tollgate handler either
	}
	servers := app.(*caddyhttp.App).Servers
	names := make([]string, 0, len(servers))
	for name := range servers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		var events []orderEvent
		collectOrder(servers[name].Routes, nil, &events)
		if err := authBeforeUse(events); err != nil {
			return fmt.Errorf("server %s: %w", name, err)
		}
	}
	return nil
}

// Stop does nothing (caddy.App).
func (*authOrder) Stop() error { return nil }

// orderEvent is a handler that reads or sets authentication
// placeholders, where it runs: the route at each level of nesting.
type orderEvent struct {
	path        []orderStep
	auth        bool   // an authentication handler
	policy      string // else: tollgate's policy that reads one
	placeholder string
}

// orderStep is a route's place in its list, and its group (routes of one
// group are exclusive: at most one of them runs for a request).
type orderStep struct {
	route int
	group string
}

// collectOrder appends the events of routes in the order a request meets
// them.
func collectOrder(routes caddyhttp.RouteList, path []orderStep, out *[]orderEvent) {
	for i, r := range routes {
		p := append(slices.Clone(path), orderStep{i, r.Group})
		for _, h := range r.Handlers {
			switch h := h.(type) {
			case *Handler:
				for _, pc := range h.Policies {
					for _, tmpl := range []string{pc.Key, pc.Plan, pc.Priority} {
						if ph := authPlaceholder(tmpl); ph != "" {
							*out = append(*out, orderEvent{path: p, policy: pc.Name, placeholder: ph})
							break
						}
					}
				}
			case *caddyauth.Authentication:
				*out = append(*out, orderEvent{path: p, auth: true})
			case *caddyhttp.Subroute:
				collectOrder(h.Routes, p, out)
			}
		}
	}
}

// authPlaceholder is the first {http.auth.*} placeholder of a template.
func authPlaceholder(tmpl string) string {
	i := strings.Index(tmpl, "{http.auth.")
	if i < 0 {
		return ""
	}
	end := strings.IndexByte(tmpl[i:], '}')
	if end < 0 {
		return tmpl[i:]
	}
	return tmpl[i : i+end+1]
}

// authBeforeUse refuses a policy that reads an authentication
// placeholder before an authentication handler that a request can meet
// after it.
func authBeforeUse(events []orderEvent) error {
	for i, use := range events {
		if use.auth {
			continue
		}
		for _, later := range events[i+1:] {
			if later.auth && !exclusive(use.path, later.path) {
				return fmt.Errorf("policy %q reads %s, which an authentication handler (basic_auth) sets, and that handler runs after tollgate "+
					"(Caddy orders tollgate before it in a site block): the placeholder would be empty on every request, and every user would take "+
					"the client address's bucket. Put both in a route block, which keeps the order written: route { basic_auth { ... } tollgate { ... } }",
					use.policy, use.placeholder)
			}
		}
	}
	return nil
}

// exclusive reports whether no request runs both paths: where they part,
// each is a route of one group.
func exclusive(a, b []orderStep) bool {
	for k := 0; k < len(a) && k < len(b); k++ {
		if a[k].route != b[k].route {
			return a[k].group != "" && a[k].group == b[k].group
		}
	}
	return false
}

var _ caddy.App = (*authOrder)(nil)
