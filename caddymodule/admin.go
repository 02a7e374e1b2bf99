package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/tollgate/core/admin"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI puts tollgate's operators' API (core/admin) on Caddy's admin
// endpoint, under its address and access controls: /tollgate/policies,
// /tollgate/keys?policy=&key= (GET reads, DELETE resets) and
// /tollgate/top?policy=. Caddy loads every admin.api module it was built
// with.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.tollgate", New: func() caddy.Module { return new(AdminAPI) }}
}

// Routes serves the operators' API (caddy.AdminRouter).
func (AdminAPI) Routes() []caddy.AdminRoute {
	h := admin.Handler("/tollgate/")
	serve := func(w http.ResponseWriter, r *http.Request) error { h.ServeHTTP(w, r); return nil }
	return []caddy.AdminRoute{{Pattern: "/tollgate/", Handler: caddy.AdminHandlerFunc(serve)}}
}
