package caddymodule

import (
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/headers"
)

// DefaultKey is a policy's key when none is set: the client IP as Caddy's
// trusted_proxies logic determines it (the Caddyfile's {client_ip}).
const DefaultKey = "{http.vars.client_ip}"

// PolicyConfig is one named policy: core's policy spec (name, key with
// placeholders, empty_key, stacked limits, cost, shadow, adaptive) and the
// requests it covers.
type PolicyConfig struct {
	config.Policy
	// MatcherSetsRaw selects the requests the policy covers; none means all.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`
}

// styleNames are the header styles' names in Caddy configs beside core's:
// `headers kong`, the per-limit set as Kong's rate-limiting sends it.
var styleNames = map[string]headers.Style{"kong": headers.PerLimit}
