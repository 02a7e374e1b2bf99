package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// keyTemplate is a policy's key (or plan) as written, parsed once: literal
// text and placeholders. It reads a placeholder as Caddy's replacer does,
// except where a client could reshape the value to get a fresh bucket:
//   - a request header or query parameter sent more than once keys on its
//     first value (Caddy's replacer joins them with commas; Go's
//     Header.Get, Kong's get_header and most upstreams read the first);
//   - a client address written as an IPv4-mapped IPv6 address
//     (::ffff:192.0.2.1) keys as the IPv4 address it is.
type keyTemplate struct {
	parts    []keyPart
	literal  string // the template with its placeholders removed
	constant bool   // no placeholder: one bucket for every request
	source   string // as written, for the log
}

type partKind uint8

const (
	literalPart  partKind = iota
	headerPart            // name: the canonical header name
	queryPart             // name: the query parameter
	varPart               // name: the http.vars variable
	addressPart           // name: a placeholder holding a client address
	replacerPart          // name: any other placeholder, read by Caddy's replacer
)

type keyPart struct {
	kind partKind
	text string // literalPart's text
	name string
}

// Caddy's request placeholders (caddyhttp's replacer.go, Caddy v2.11.9), by
// exact name and by prefix, and the namespaces other modules fill at
// request time (vars, regexp captures, matchers, authentication, errors,
// the environment, system and time). A key that names anything else is a
// typo: every request would share one bucket.
var (
	requestPlaceholders = []string{
		"http.request.method", "http.request.scheme", "http.request.proto", "http.request.proto_name",
		"http.request.host", "http.request.port", "http.request.hostport",
		"http.request.local", "http.request.local.host", "http.request.local.port",
		"http.request.remote", "http.request.remote.host", "http.request.remote.port",
		"http.request.uri", "http.request.uri_escaped", "http.request.uri.path", "http.request.uri.path_escaped",
		"http.request.uri.path.file", "http.request.uri.path.dir", "http.request.uri.path.file.base",
		"http.request.uri.path.file.ext", "http.request.uri.query", "http.request.uri.query_escaped",
		"http.request.uri.prefixed_query", "http.request.uuid", "http.request.body", "http.request.body_base64",
		"http.request.orig_method", "http.request.orig_uri", "http.request.orig_uri.path",
		"http.request.orig_uri.path.file", "http.request.orig_uri.path.file_escaped", "http.request.orig_uri.path.dir",
		"http.request.orig_uri.query", "http.request.orig_uri.prefixed_query",
	}
	requestPlaceholderPrefixes = []string{
		"http.request.header.", "http.request.cookie.", "http.request.uri.query.", "http.request.tls.",
		"http.request.host.labels.", "http.request.uri.path.", "http.request.orig_uri.path.", "http.request.remote.host/",
		"http.vars.", "http.regexp.", "http.matchers.", "http.auth.", "http.error.", "env.", "system.", "time.",
	}
	// addressPlaceholders hold a client or peer address.
	addressPlaceholders = []string{"http.request.remote.host", "http.vars.client_ip", "http.request.local.host"}
)

// knownPlaceholder reports whether a request can fill name. A name
// without a dot is one another handler may set for the request (the map
// directive's destinations, such as {plan}); a dotted name must be one of
// the namespaces above, which is what catches a typo in a long name.
func knownPlaceholder(name string) bool {
	if !strings.Contains(name, ".") || slices.Contains(requestPlaceholders, name) {
		return true
	}
	for _, prefix := range requestPlaceholderPrefixes {
		if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
			return true
		}
	}
	return false
}

// parseKeyTemplate reads a key written with Caddy's placeholders. A brace
// is escaped with a backslash, as in Caddy; a brace that opens no
// placeholder or is never closed, an empty placeholder and a placeholder no
// request fills are refused, naming it.
func parseKeyTemplate(s string) (*keyTemplate, error) {
	t := &keyTemplate{source: s}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, keyPart{kind: literalPart, text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '}'):
			lit.WriteByte(s[i+1])
			i++
		case c == '}':
			return nil, fmt.Errorf("%q: a '}' at byte %d closes no placeholder (write \\} for a brace)", s, i)
		case c == '{':
			end := strings.IndexAny(s[i+1:], "{}")
			if end < 0 || s[i+1+end] == '{' {
				return nil, fmt.Errorf("%q: the placeholder at byte %d is not closed", s, i)
			}
			name := s[i+1 : i+1+end]
			if err := checkPlaceholder(s, name); err != nil {
				return nil, err
			}
			flush()
			t.parts = append(t.parts, placeholderPart(name))
			i += 1 + end
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	for _, p := range t.parts {
		if p.kind == literalPart {
			t.literal += p.text
		}
	}
	t.constant = len(t.parts) <= 1 && (len(t.parts) == 0 || t.parts[0].kind == literalPart)
	return t, nil
}

func checkPlaceholder(template, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%q: an empty placeholder {}", template)
	case strings.ContainsAny(name, " \t\r\n"):
		return fmt.Errorf("%q: placeholder {%s} holds a space", template, name)
	case !knownPlaceholder(name):
		return fmt.Errorf("%q: unknown placeholder {%s}: a key reads Caddy's request placeholders "+
			"({http.request.*}, {http.vars.*}, {http.regexp.*}, {http.auth.*}, {env.*}...) or a name without dots that "+
			"another handler sets (map); a key that is the same for every request is written without braces", template, name)
	}
	return nil
}

func placeholderPart(name string) keyPart {
	if h, ok := strings.CutPrefix(name, "http.request.header."); ok {
		return keyPart{kind: headerPart, name: textproto.CanonicalMIMEHeaderKey(h)}
	}
	if q, ok := strings.CutPrefix(name, "http.request.uri.query."); ok {
		return keyPart{kind: queryPart, name: q}
	}
	if slices.Contains(addressPlaceholders, name) {
		return keyPart{kind: addressPart, name: name}
	}
	if v, ok := strings.CutPrefix(name, "http.vars."); ok {
		return keyPart{kind: varPart, name: v}
	}
	return keyPart{kind: replacerPart, name: name}
}

// eval fills the template for r.
func (t *keyTemplate) eval(r *http.Request, repl *caddy.Replacer) string {
	if len(t.parts) == 1 {
		return t.parts[0].value(r, repl)
	}
	var b strings.Builder
	for i := range t.parts {
		b.WriteString(t.parts[i].value(r, repl))
	}
	return b.String()
}

func (p *keyPart) value(r *http.Request, repl *caddy.Replacer) string {
	switch p.kind {
	case literalPart:
		return p.text
	case headerPart:
		if v := r.Header[p.name]; len(v) > 0 {
			return v[0]
		}
		return ""
	case queryPart:
		return firstQueryValue(r.URL.RawQuery, p.name)
	case varPart:
		return caddy.ToString(caddyhttp.GetVar(r.Context(), p.name))
	case addressPart:
		var v string
		if name, ok := strings.CutPrefix(p.name, "http.vars."); ok {
			v = caddy.ToString(caddyhttp.GetVar(r.Context(), name))
		} else {
			v, _ = repl.GetString(p.name)
		}
		return unmapIPv4(v)
	}
	v, _ := repl.GetString(p.name)
	return v
}

// unmapIPv4 writes an IPv4-mapped IPv6 address as its IPv4 address, so a
// client keys the same however its address is written.
func unmapIPv4(v string) string {
	if !strings.Contains(v, ":") || !strings.Contains(v, ".") { // IPv4, IPv6 or not an address
		return v
	}
	if a, err := netip.ParseAddr(v); err == nil && a.Is4In6() {
		return a.Unmap().String()
	}
	return v
}

// firstQueryValue is url.ParseQuery(raw)[name][0] without parsing the
// rest of the query: the first value of the parameter, "" if it is absent.
// Pairs that url.ParseQuery skips (a ';', a bad escape) are skipped.
func firstQueryValue(raw, name string) string {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" || strings.Contains(pair, ";") {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(k, "%+") {
			var err error
			if k, err = url.QueryUnescape(k); err != nil {
				continue
			}
		}
		if k != name {
			continue
		}
		uv, err := url.QueryUnescape(v)
		if err != nil {
			continue
		}
		return uv
	}
	return ""
}

// spoofableClientIP says why a policy keyed on the client address would
// let a client choose its own bucket on srv, or "" if none would. With
// trusted_proxies (or trusted_proxies_unix) and without
// trusted_proxies_strict, Caddy takes the client address from the
// leftmost X-Forwarded-For entry (caddyhttp/server.go,
// trustedRealClientIP), which a client behind the trusted proxy writes
// itself; with strict, the rightmost address not in trusted_proxies, which
// only the proxies wrote. Provision refuses the first case.
func spoofableClientIP(srv *caddyhttp.Server, policies []*policy) string {
	if srv == nil || srv.TrustedProxiesStrict > 0 {
		return ""
	}
	var keyed []string
	for _, p := range policies {
		for _, part := range p.key.parts {
			if part.kind == addressPart && part.name == "http.vars.client_ip" {
				keyed = append(keyed, fmt.Sprintf("%q", p.compiled.Policy.Name()))
				break
			}
		}
	}
	if len(keyed) == 0 {
		return ""
	}
	trusts, known := trustsProxies(srv)
	if known && !trusts {
		return ""
	}
	why := "this server trusts proxies (trusted_proxies) without trusted_proxies_strict, so Caddy takes the client address " +
		"from the leftmost X-Forwarded-For entry, which the client writes itself: every request could choose its own bucket"
	if !known {
		why = "tollgate cannot tell whether this server trusts proxies (this Caddy keeps trusted_proxies where tollgate cannot see), " +
			"and without trusted_proxies_strict a trusted proxy's client chooses its own address"
	}
	return fmt.Sprintf("policy %s: keyed on the client address ({client_ip}, the default key), but %s; "+
		"add trusted_proxies_strict beside trusted_proxies (Caddyfile: the global option servers { trusted_proxies_strict }), "+
		"which takes the rightmost address not in trusted_proxies, or key the policy on something the client cannot write",
		strings.Join(keyed, ", "), why)
}

// unsetPlaceholder says which placeholder of the policies' templates no
// request can fill on srv, or "" if every one can: a name without dots is
// no placeholder of Caddy's request replacer, so it is known only as the
// destination of a map handler of srv (any route, before or after this
// handler, in subroutes too). Dotted names were checked when parsed.
func unsetPlaceholder(srv *caddyhttp.Server, policies []*policy) string {
	if srv == nil {
		return ""
	}
	var dests map[string]bool
	for _, p := range policies {
		for field, t := range map[string]*keyTemplate{"key": p.key, "plan": p.plan, "priority": p.priority} {
			if t == nil {
				continue
			}
			for _, part := range t.parts {
				if part.kind != replacerPart || strings.Contains(part.name, ".") {
					continue
				}
				if dests == nil {
					dests = map[string]bool{}
					mapDestinations(srv.Routes, dests)
					if srv.Errors != nil {
						mapDestinations(srv.Errors.Routes, dests)
					}
				}
				if !dests[part.name] {
					return fmt.Sprintf("policy %q %s: {%s} is not a placeholder a request fills: Caddy's replacer has no such name, "+
						"and no map handler of this server sets it (a name without dots is a map destination; "+
						"request values are {http.request.header.*}, {http.request.uri.query.*}, {http.request.cookie.*}, {http.vars.*}, ...)",
						p.compiled.Policy.Name(), field, part.name)
				}
			}
		}
	}
	return ""
}

// mapDestinations adds to into the placeholder names the map handlers of
// routes set. Caddy provisions a server's handlers in order, so a route
// may hold its handlers loaded or still as JSON.
func mapDestinations(routes caddyhttp.RouteList, into map[string]bool) {
	for _, r := range routes {
		for _, raw := range r.HandlersRaw {
			rawMapDestinations(raw, into)
		}
		for _, h := range r.Handlers {
			if sub, ok := h.(*caddyhttp.Subroute); ok {
				mapDestinations(sub.Routes, into)
				continue
			}
			if b, err := json.Marshal(h); err == nil {
				rawMapDestinations(b, into)
			}
		}
	}
}

// rawMapDestinations adds the destinations of a handler written as JSON
// (a map's "destinations", a subroute's routes' handlers).
func rawMapDestinations(raw json.RawMessage, into map[string]bool) {
	var h struct {
		Destinations []string `json:"destinations"`
		Routes       []struct {
			Handle []json.RawMessage `json:"handle"`
		} `json:"routes"`
	}
	if json.Unmarshal(raw, &h) != nil {
		return
	}
	for _, d := range h.Destinations {
		into[strings.TrimSuffix(strings.TrimPrefix(d, "{"), "}")] = true
	}
	for _, r := range h.Routes {
		for _, sub := range r.Handle {
			rawMapDestinations(sub, into)
		}
	}
}

// trustsProxies reports whether srv trusts any proxy, and whether it
// could tell. Caddy loads trusted_proxies into an unexported field and
// clears TrustedProxiesRaw before any handler is provisioned
// (caddyhttp/app.go), so the loaded source is looked at by reflection; a
// Caddy whose Server has no such field cannot be told (known false).
func trustsProxies(srv *caddyhttp.Server) (trusts, known bool) {
	if len(srv.TrustedProxiesRaw) > 0 || srv.TrustedProxiesUnix {
		return true, true
	}
	f := reflect.ValueOf(srv).Elem().FieldByName("trustedProxies")
	if !f.IsValid() || f.Kind() != reflect.Interface {
		return false, false
	}
	return !f.IsNil(), true
}

// clientAddress is the client's address as the default key reads it
// (Caddy's client_ip variable, after its trusted_proxies logic; an
// IPv4-mapped address as its IPv4 address): the key of a request without
// one under empty_key client.
func clientAddress(r *http.Request) string {
	return unmapIPv4(caddy.ToString(caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey)))
}
