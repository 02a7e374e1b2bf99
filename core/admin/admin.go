// Package admin is the operators' API over the gates adapters register:
// the policies in force with their limits, effective limits and store
// health; one key's usage in each limit (as the headers would say it),
// read without changing it; a reset of one key; and the keys each policy
// denied most. It is an http.Handler: an adapter mounts it on its
// gateway's admin endpoint, under that endpoint's access controls.
package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// registered are the live gates, newest last.
var (
	mu         sync.Mutex
	registered []*entry
)

type entry struct {
	gate  *gate.Gate
	store *openstore.Handle
	// generation is the config the gate belongs to: within one, a policy
	// name names one policy (Register refuses two different ones).
	generation any
	// scope, when its Name is set, names the gate's one rule instead of
	// its policy's name, and the keys operators give are read in it
	// (plugin instances with scoped keys and one policy name for all).
	scope gate.Scope
}

// Register makes a gate's policies visible to the API, over the store
// they use; call the returned func when the config is unloaded.
// generation identifies the config being loaded (any comparable value):
// a policy name that another gate of the same generation registered for a
// different policy (other limits, plans or store) is refused, since the
// API could then reach only one of them. During a reload the newest
// generation's policy answers.
func Register(g *gate.Gate, h *openstore.Handle, generation any) (unregister func(), err error) {
	mu.Lock()
	for _, e := range registered {
		if e.generation == nil || e.generation != generation {
			continue
		}
		for i := range e.gate.Rules() {
			for _, r := range g.Rules() {
				theirs, ours := &e.gate.Rules()[i], &r
				if theirs.Limiter.Policy().Name() == ours.Limiter.Policy().Name() && (e.store != h || signature(theirs) != signature(ours)) {
					mu.Unlock()
					return nil, fmt.Errorf("policy %q: the name is given to two different policies in this config; "+
						"a policy name addresses the operators' API (and the policy's counters), so give each its own", ours.Limiter.Policy().Name())
				}
			}
		}
	}
	mu.Unlock()
	return register(&entry{gate: g, store: h, generation: generation}), nil
}

// signature is what makes two policies of one name the same policy: their
// limits, as configured, for every plan.
func signature(r *gate.Rule) string {
	var b strings.Builder
	for _, v := range r.Family.Plans() {
		b.WriteString(v.Plan())
		for _, l := range v.Configured() {
			fmt.Fprintf(&b, "|%s %d/%d %s %d %d", l.Name, l.Count, l.Window, l.Algorithm, l.Burst, l.MaxDelay)
		}
		b.WriteString(";")
	}
	return b.String()
}

// RegisterRule makes a gate visible as the policy scope.Name, whose store
// keys are the keys operators give in scope, until the returned func
// is called (when its config is closed). It replaces an earlier
// registration of the same name: an adapter that starts the new config
// before it closes the old one (a gateway's plugin instances, one per
// worker process) answers with the newest, and a config that is never
// closed (a gateway may forget some) leaves no entry behind once
// replaced.
func RegisterRule(scope gate.Scope, g *gate.Gate, h *openstore.Handle) (unregister func()) {
	mu.Lock()
	registered = slices.DeleteFunc(registered, func(e *entry) bool { return e.scope.Name == scope.Name })
	mu.Unlock()
	return register(&entry{gate: g, store: h, scope: scope})
}

func register(e *entry) (unregister func()) {
	mu.Lock()
	registered = append(registered, e)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		for i, r := range registered {
			if r == e {
				registered = append(registered[:i], registered[i+1:]...)
				return
			}
		}
	}
}

// find returns the newest registered rule of the policy named name (during
// a reload the new config's).
func find(name string) (*entry, int, bool) {
	mu.Lock()
	defer mu.Unlock()
	for k := len(registered) - 1; k >= 0; k-- {
		for i := range registered[k].gate.Rules() {
			if registered[k].policyName(i) == name {
				return registered[k], i, true
			}
		}
	}
	return nil, 0, false
}

// policyName is what the API calls rule i: the entry's name, followed by
// ",policy=<the rule's policy>" when its gate has several rules.
func (e *entry) policyName(i int) string {
	rules := e.gate.Rules()
	switch {
	case e.scope.Name == "":
		return rules[i].Limiter.Policy().Name()
	case len(rules) > 1:
		return e.scope.Name + ",policy=" + rules[i].Limiter.Policy().Name()
	}
	return e.scope.Name
}

// showKey is a store key as operators see it: its identifier in the
// entry's scope, hashed unless the policy shows keys in clear.
func (e *entry) showKey(p *core.Policy, key string) string {
	return p.ShowKey(e.scope.Identifier(key))
}

// Handler serves, under prefix (such as "/tollgate/"):
//
//	GET    version                                tollgate's release ({"version": core.Version})
//	GET    policies                               every policy in force
//	GET    keys?policy=<name>&key=<key>[&plan=<p>] one key's usage in each limit
//	DELETE keys?policy=<name>&key=<key>[&limit=<l>] forget one key's usage (every limit, or the one named)
//	POST   keys/show   {"policy", "key"[, "plan"]}  as GET keys, the key in the body
//	POST   keys/reset  {"policy", "key"[, "limit"]} as DELETE keys, the key in the body
//	GET    top?policy=<name>                      the keys the policy denied most (every policy's without one)
//	GET    (the prefix itself)                    this list, the version and the policies in force
//
// Answers are JSON; keys are shown hashed unless the policy shows them in
// clear (core.Policy.ShowKey). A gateway's admin endpoint may log each
// request's URL, and with it a key given in the query: the POST forms keep
// the key out of the URL.
func Handler(prefix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, status, err := serve(r, strings.TrimPrefix(r.URL.Path, prefix))
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(out)
	})
}

// maxBody bounds a POST's JSON body in bytes: a policy, a key (a gateway
// hashes keys over 256 bytes) and a plan or limit name.
const maxBody = 16 << 10

// bodyParams reads a POST form's JSON body into the query parameters the
// GET and DELETE forms take.
func bodyParams(r *http.Request) (url.Values, error) {
	var body struct {
		Policy string `json:"policy"`
		Key    string `json:"key"`
		Plan   string `json:"plan"`
		Limit  string `json:"limit"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return nil, fmt.Errorf("body: want a JSON object {\"policy\", \"key\", \"plan\" or \"limit\"} of at most %d bytes: %v", maxBody, err)
	}
	q := url.Values{}
	for name, v := range map[string]string{"policy": body.Policy, "key": body.Key, "plan": body.Plan, "limit": body.Limit} {
		if v != "" {
			q.Set(name, v)
		}
	}
	return q, nil
}

// Endpoints are what Handler serves, as its index lists them.
var Endpoints = []string{
	"GET version", "GET policies", "GET keys?policy=<name>&key=<key>[&plan=<plan>]",
	"DELETE keys?policy=<name>&key=<key>[&limit=<limit>]", `POST keys/show {"policy", "key"[, "plan"]}`,
	`POST keys/reset {"policy", "key"[, "limit"]}`, "GET top[?policy=<name>]",
}

// index is what GET of the prefix itself answers: what is there.
type index struct {
	Version   string   `json:"version"`
	Policies  []string `json:"policies"`
	Endpoints []string `json:"endpoints"`
}

func serve(r *http.Request, path string) (any, int, error) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	switch path {
	case "":
		if r.Method != http.MethodGet {
			return nil, http.StatusMethodNotAllowed, fmt.Errorf("%s of the index: want GET", r.Method)
		}
		in := index{Version: core.Version, Policies: []string{}, Endpoints: Endpoints}
		for _, p := range policies() {
			in.Policies = append(in.Policies, p["name"].(string))
		}
		return in, 0, nil
	case "version", "policies", "keys", "keys/show", "keys/reset", "top":
	default:
		return nil, http.StatusNotFound, fmt.Errorf("no endpoint %q (GET the API's own path for the list: %s)", path, strings.Join(Endpoints, "; "))
	}
	if path == "policies" && r.Method == http.MethodGet {
		return policies(), 0, nil
	}
	if path == "version" && r.Method == http.MethodGet {
		return map[string]string{"version": core.Version}, 0, nil
	}
	q := r.URL.Query()
	if r.Method == http.MethodPost {
		var method string
		switch path {
		case "keys/show":
			method = http.MethodGet
		case "keys/reset":
			method = http.MethodDelete
		default:
			return nil, http.StatusNotFound, fmt.Errorf("POST %s: want POST keys/show or keys/reset", path)
		}
		var err error
		if q, err = bodyParams(r); err != nil {
			return nil, http.StatusBadRequest, err
		}
		r, path = r.Clone(ctx), "keys"
		r.Method = method
	}
	if path == "top" && r.Method == http.MethodGet && q.Get("policy") == "" {
		return topOfAll(ctx), 0, nil
	}
	e, i, ok := find(q.Get("policy"))
	if !ok {
		return nil, http.StatusNotFound, fmt.Errorf("policy %q: not in force", q.Get("policy"))
	}
	return e.answer(ctx, i, r.Method, path, q)
}

// answer serves one call on rule i of e.
func (e *entry) answer(ctx context.Context, i int, method, path string, q url.Values) (any, int, error) {
	lim := e.gate.Rules()[i].Limiter
	p, name, key := lim.Policy(), e.policyName(i), e.scope.Key(q.Get("key"))
	switch {
	case path == "top" && method == http.MethodGet:
		top := []map[string]any{}
		for _, h := range e.gate.TopDenied(i) {
			top = append(top, map[string]any{"key": e.showKey(p, h.Key), "denials": h.Count, "overcount": h.Error})
		}
		return map[string]any{"policy": name, "top_denied": top}, 0, nil
	case path != "keys":
	case q.Get("key") == "":
		return nil, http.StatusBadRequest, fmt.Errorf("key: missing (keys?policy=<name>&key=<key>)")
	case method == http.MethodGet:
		// The plan's own policy, above any reserve: its limits as configured.
		variant, limited := e.gate.Rules()[i].Family.For(q.Get("plan"), math.MaxInt)
		if !limited {
			return nil, http.StatusBadRequest, fmt.Errorf("plan %q: unlimited, nothing is counted", q.Get("plan"))
		}
		var d core.Decision
		if err := lim.Inspect(ctx, variant, key, &d); err != nil {
			return nil, http.StatusBadGateway, err
		}
		return usage(name, variant, e.showKey(p, key), &d), 0, nil
	case method == http.MethodDelete:
		limit, err := limitIndex(p, q.Get("limit"))
		if err != nil {
			return nil, http.StatusBadRequest, err
		}
		if err := lim.Reset(ctx, key, limit); err != nil {
			return nil, http.StatusBadGateway, err
		}
		return map[string]any{"policy": name, "key": e.showKey(p, key), "limit": cmp.Or(q.Get("limit"), "all"), "reset": true}, 0, nil
	}
	return nil, http.StatusNotFound, fmt.Errorf("%s %s: want GET policies, GET or DELETE keys, GET top", method, path)
}

// topOfAll is GET top without a policy: every policy's keys denied most.
func topOfAll(ctx context.Context) []any {
	mu.Lock()
	entries := append([]*entry(nil), registered...)
	mu.Unlock()
	out := []any{}
	for _, e := range entries {
		for i := range e.gate.Rules() {
			if top, _, err := e.answer(ctx, i, http.MethodGet, "top", nil); err == nil {
				out = append(out, top)
			}
		}
	}
	return out
}

// limitIndex finds the limit labelled label (as policies and keys show
// it); "" is every limit.
func limitIndex(p *core.Policy, label string) (int, error) {
	if label == "" {
		return core.AllLimits, nil
	}
	var labels []string
	for i, l := range p.Configured() {
		if l.Label() == label {
			return i, nil
		}
		labels = append(labels, l.Label())
	}
	return 0, fmt.Errorf("limit %q: policy %q has %s", label, p.Name(), strings.Join(labels, ", "))
}

// usage is one key's usage in each limit, as the headers would say it.
func usage(name string, p *core.Policy, key string, d *core.Decision) map[string]any {
	limits := p.Limits()
	out := []map[string]any{}
	for i := 0; i < d.N; i++ {
		res := d.Results[i]
		u := map[string]any{"limit": limits[i].Label(), "algorithm": limits[i].Algorithm.String(), "count": res.Quota,
			"used": res.Quota - res.Remaining, "remaining": res.Remaining, "reset_seconds": core.Seconds(res.Reset)}
		if b := limits[i].EffectiveBurst(); b > 0 {
			// A bucket (token bucket, GCRA, a shaper's queue) holds burst
			// units at once, refilled at count per window: what is used
			// and left is of the burst, in the algorithm's own terms.
			u["burst"], u["used"] = b, max(0, b-res.Remaining)
		}
		out = append(out, u)
	}
	return map[string]any{"policy": name, "plan": p.Plan(), "key": key, "limits": out}
}

// policies describes every policy in force, with its store's health.
func policies() []map[string]any {
	mu.Lock()
	entries := append([]*entry(nil), registered...)
	mu.Unlock()
	out := []map[string]any{}
	for _, e := range entries {
		kind, open := "memory", false
		switch {
		case e.store.Kind != "":
			kind = e.store.Kind
		case e.store.Eventual != nil:
			kind = "redis (eventual)"
		case e.store.Redis != nil:
			kind = "redis"
		}
		if e.store.Failover != nil {
			open = e.store.Failover.Open()
		}
		for i, r := range e.gate.Rules() {
			p := r.Limiter.Policy()
			var limits []map[string]any
			for _, v := range r.Family.Plans() {
				for i, l := range v.Configured() {
					lim := map[string]any{"plan": v.Plan(), "limit": l.Label(), "algorithm": l.Algorithm.String(),
						"count": l.Count, "effective_count": v.Limits()[i].Count, "window_seconds": l.Window.Seconds()}
					if b := l.EffectiveBurst(); b > 0 {
						lim["burst"] = b
					}
					if l.MaxDelay > 0 {
						lim["max_delay_seconds"] = l.MaxDelay.Seconds()
					}
					limits = append(limits, lim)
				}
			}
			pol := map[string]any{"name": e.policyName(i), "limits": limits, "shadow": p.Shadow(), "plans": r.Family.Names(),
				"store": kind, "breaker_open": open}
			if a := p.Adaptive(); a != nil {
				pol["adaptive_factor"] = a.Factor()
			}
			if e.store.Eventual != nil {
				pol["eventual_syncs"] = e.store.Eventual.Syncs() // completed: a reset reaches this node by the second after it
			}
			out = append(out, pol)
		}
	}
	return out
}
