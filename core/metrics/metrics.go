// Package metrics is tollgate's Prometheus series for a gateway's policies:
// decisions by policy, deciding limit and result, store errors and
// latency, the breaker's state and adaptive factors. Labels are policy,
// limit and result names only: never a request key. An adapter registers
// them in its gateway's registry (served on its admin endpoint's /metrics).
package metrics

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// Set is the series of one config's policies.
type Set struct {
	policies [][]*Policy // per rule, per plan (core.Family.Plans)
	gate     *gate.Gate
}

// tops are the top-denied collectors, one per registry: every live config's
// gate reports through it (Set.Close takes a gate out).
var tops sync.Map // *prometheus.Registry → *topCollector

// topCollector exports tollgate_top_denied{policy,key}: the keys each
// policy denied most recently, at most gate.Config.TopDenied per policy, so
// the label values stay bounded and fade out as the sketch ages.
type topCollector struct {
	desc  *prometheus.Desc
	reg   *prometheus.Registry
	mu    sync.Mutex
	gates map[*gate.Gate]struct{}
}

func (c *topCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *topCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	gates := make([]*gate.Gate, 0, len(c.gates))
	for g := range c.gates {
		gates = append(gates, g)
	}
	c.mu.Unlock()
	seen := map[[2]string]bool{} // a reload's old and new gates may share a policy
	for _, g := range gates {
		for i, r := range g.Rules() {
			p := r.Limiter.Policy()
			for _, h := range g.TopDenied(i) {
				id := [2]string{p.Name(), p.ShowKey(h.Key)}
				if !seen[id] {
					seen[id] = true
					ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(h.Count), id[0], id[1])
				}
			}
		}
	}
}

// Close takes the set's gate out of the top-denied metric (its config was
// unloaded).
func (s *Set) Close() {
	// The collector lives while a config of its registry does, so a
	// registry's entry goes with its last config (a reload that brings a new
	// registry leaves nothing behind).
	tops.Range(func(_, c any) bool {
		top := c.(*topCollector)
		top.mu.Lock()
		delete(top.gates, s.gate)
		empty := len(top.gates) == 0
		top.mu.Unlock()
		if empty {
			top.reg.Unregister(top)
			tops.CompareAndDelete(top.reg, top)
		}
		return true
	})
}

// metrics are the shared vectors.
type metrics struct {
	decisions     *prometheus.CounterVec // policy, limit, result
	storeErrors   *prometheus.CounterVec // policy
	storeDuration *durationVec           // policy
	priorities    *prometheus.CounterVec // policy, plan, priority, result (policies with a reserve)
}

// The priorities a decision of a policy with a reserve is counted under:
// at or above the reserve's level (it may use the reserve), or below it.
var priorityNames = [2]string{"reserved", "unreserved"}

// The results a decision is counted under, indexes into resultNames.
const (
	resultAllowed  = iota
	resultDenied   // denied by the limits
	resultShadowed // denied by the limits, let through by shadow mode
	resultDelayed  // allowed after a shaping delay
	resultCount
)

var resultNames = [resultCount]string{"allowed", "denied", "shadowed", "delayed"}

// New registers the series of gate's policies over store h in reg (nil: a
// registry nobody reads) and returns them; equal series registered by
// another config in the same registry are shared. Close the set when its
// config is unloaded.
func New(reg *prometheus.Registry, g *gate.Gate, h *openstore.Handle) (*Set, error) {
	if reg == nil {
		// A context without a registry (tests): count into one nobody reads.
		reg = prometheus.NewRegistry()
	}
	var policies []*core.Policy
	for _, r := range g.Rules() {
		policies = append(policies, r.Limiter.Policy())
	}
	c, loaded := tops.LoadOrStore(reg, &topCollector{reg: reg, gates: map[*gate.Gate]struct{}{}, desc: prometheus.NewDesc(
		"tollgate_top_denied", "Recent denials of the keys each policy denied most (a decaying Space-Saving estimate; keys hashed unless the policy shows them in clear).",
		[]string{"policy", "key"}, nil)})
	top := c.(*topCollector)
	if !loaded {
		if err := reg.Register(top); err != nil {
			return nil, err
		}
	}
	top.mu.Lock()
	top.gates[g] = struct{}{}
	top.mu.Unlock()
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tollgate", Name: "decisions_total",
			Help: "Rate-limit decisions by policy, plan (empty without plans), deciding limit and result (allowed, denied, shadowed, delayed).",
		}, []string{"policy", "plan", "limit", "result"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tollgate", Name: "store_errors_total",
			Help: "Decisions the shared store (Redis) could not make, so its failure policy made them.",
		}, []string{"policy"}),
		storeDuration: newDurationVec("tollgate_store_duration_seconds", "Time the store took to decide one request, in seconds."),
		priorities: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "tollgate", Name: "priority_decisions_total",
			Help: "Decisions of policies with a reserve by policy, plan, priority (reserved: at or above the reserve's level; unreserved: below it) and result.",
		}, []string{"policy", "plan", "priority", "result"}),
	}
	var err error
	if m.decisions, err = register(reg, m.decisions); err != nil {
		return nil, err
	}
	if m.priorities, err = register(reg, m.priorities); err != nil {
		return nil, err
	}
	if m.storeErrors, err = register(reg, m.storeErrors); err != nil {
		return nil, err
	}
	if m.storeDuration, err = register(reg, m.storeDuration); err != nil {
		return nil, err
	}
	set := &Set{gate: g}
	for i := range g.Rules() {
		var variants []*Policy
		for _, v := range g.Rules()[i].Family.Plans() {
			variants = append(variants, m.forPolicy(v, g.Rules()[i].Family))
		}
		set.policies = append(set.policies, variants)
	}
	for i, pol := range policies {
		a := pol.Adaptive()
		if a == nil {
			continue
		}
		factor := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "tollgate", Name: "adaptive_factor",
			Help:        "Fraction of the configured limits an adaptive policy allows now (1: all of it).",
			ConstLabels: prometheus.Labels{"policy": pol.Name()},
		}, a.Factor)
		if _, err := register(reg, factor); err != nil {
			return nil, err
		}
		latency := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "tollgate", Name: "adaptive_latency_seconds",
			Help:        "The upstream's latency an adaptive policy judged in its last interval: the quantile of its successful answers (0 without answers).",
			ConstLabels: prometheus.Labels{"policy": pol.Name()},
		}, func() float64 { return a.LastQuantile().Seconds() })
		if _, err := register(reg, latency); err != nil {
			return nil, err
		}
		unjudged := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "tollgate", Name: "adaptive_stalled_intervals_total",
			Help:        "Intervals an adaptive policy left unjudged because the gateway itself stalled (its process stopped or starved), which would have read as the upstream's latency.",
			ConstLabels: prometheus.Labels{"policy": pol.Name()},
		}, func() float64 { return float64(a.Unjudged()) })
		if _, err := register(reg, unjudged); err != nil {
			return nil, err
		}
		for _, v := range g.Rules()[i].Family.Plans() {
			for i, id := range limitLabels(v) {
				effective := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Namespace: "tollgate", Name: "effective_limit",
					Help:        "Count per window an adaptive policy's limit allows now.",
					ConstLabels: prometheus.Labels{"policy": v.Name(), "plan": v.Plan(), "limit": id},
				}, func() float64 { return float64(v.Limits()[i].Count) })
				if _, err := register(reg, effective); err != nil {
					return nil, err
				}
			}
		}
	}
	if h.Failover != nil {
		for _, pol := range policies {
			breaker := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "tollgate", Name: "breaker_open",
				Help:        "1 while the shared store's breaker is open (Redis skipped, the failure policy decides), else 0.",
				ConstLabels: prometheus.Labels{"policy": pol.Name()},
			}, func() float64 {
				if h.Failover.Open() {
					return 1
				}
				return 0
			})
			if _, err := register(reg, breaker); err != nil {
				return nil, err
			}
		}
	}
	return set, nil
}

// limitLabels are a policy's limit labels as configured, so an adapted
// count does not rename a series.
func limitLabels(p *core.Policy) []string {
	var labels []string
	for _, l := range p.Configured() {
		labels = append(labels, l.Label())
	}
	return labels
}

// Observe counts policy i's decision (or its store's error) and how long
// the store took.
func (s *Set) Observe(i int, d *core.Decision, err error, took time.Duration) {
	variants := s.policies[i]
	pm := variants[0]
	if err == nil && len(variants) > 1 {
		pm = variants[d.Policy.PlanIndex()]
	}
	pm.observe(d, err, took)
}

// register registers c, or returns the equal collector registered before (by
// another tollgate handler in the same config).
func register[C prometheus.Collector](reg *prometheus.Registry, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

// Policy is one policy's series, resolved once so a request does not look
// labels up.
type Policy struct {
	decisions   [][resultCount]prometheus.Counter // [limit][result]
	storeErrors prometheus.Counter
	duration    *durationHistogram
	// byPriority, for a policy with a reserve, counts its decisions by
	// priority ([0] reserved, [1] unreserved: decided by unreserved).
	byPriority *[2][resultCount]prometheus.Counter
	unreserved *core.Policy
}

func (m *metrics) forPolicy(p *core.Policy, f *core.Family) *Policy {
	pm := &Policy{
		storeErrors: m.storeErrors.WithLabelValues(p.Name()),
		duration:    m.storeDuration.forPolicy(p.Name()),
	}
	for _, id := range limitLabels(p) {
		var byResult [resultCount]prometheus.Counter
		for r, name := range resultNames {
			byResult[r] = m.decisions.WithLabelValues(p.Name(), p.Plan(), id, name)
		}
		pm.decisions = append(pm.decisions, byResult)
	}
	if u, _ := f.Below(p); u != nil {
		pm.unreserved, pm.byPriority = u, new([2][resultCount]prometheus.Counter)
		for i, priority := range priorityNames {
			for r, name := range resultNames {
				pm.byPriority[i][r] = m.priorities.WithLabelValues(p.Name(), p.Plan(), priority, name)
			}
		}
	}
	return pm
}

// observe counts one decision.
func (pm *Policy) observe(d *core.Decision, err error, took time.Duration) {
	pm.duration.observe(took)
	if err != nil || d.Fallback {
		pm.storeErrors.Inc()
	}
	if err != nil {
		return
	}
	result := resultAllowed
	switch {
	case !d.Allowed:
		result = resultDenied
	case d.Shadowed:
		result = resultShadowed
	case d.Delay > 0:
		result = resultDelayed
	}
	pm.decisions[d.Index][result].Inc()
	if pm.byPriority != nil {
		tier := 0
		if d.Policy == pm.unreserved {
			tier = 1
		}
		pm.byPriority[tier][result].Inc()
	}
}
