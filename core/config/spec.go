package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/gate"
)

// Limit is one limit as configured: Count units per Window.
type Limit struct {
	// Count is the units allowed per Window.
	Count int64 `json:"count"`
	// Window is the window length.
	Window algo.Duration `json:"window"`
	// Algorithm is fixed_window, sliding_log, sliding_counter (default),
	// token_bucket, gcra or leaky_bucket.
	Algorithm string `json:"algorithm,omitempty"`
	// Burst is token_bucket's bucket size (default Count), the units gcra
	// admits at once (default 1), or leaky_bucket's queue size (default:
	// what MaxDelay holds).
	Burst int64 `json:"burst,omitempty"`
	// MaxDelay is leaky_bucket's longest shaping delay.
	MaxDelay algo.Duration `json:"max_delay,omitempty"`
	// Name labels the limit in headers; default "<count>/<window>".
	Name string `json:"name,omitempty"`
	// AfterResponse charges the limit what the response costs (the
	// policy's Charge) instead of charging the request as it arrives.
	AfterResponse bool `json:"after_response,omitempty"`
}

// Limit validates s into a Limit; errors name the field and value.
func (s *Limit) Limit() (algo.Limit, error) {
	l := algo.Limit{Name: s.Name, Count: s.Count, Window: time.Duration(s.Window), Burst: s.Burst, MaxDelay: time.Duration(s.MaxDelay),
		AfterResponse: s.AfterResponse}
	if s.Algorithm != "" {
		a, err := algo.ParseAlgorithm(s.Algorithm)
		if err != nil {
			return l, fmt.Errorf("algorithm: %w", err)
		}
		if a == algo.Penalty {
			return l, fmt.Errorf("algorithm: penalty is not a limit's algorithm; give the policy a penalty instead")
		}
		l.Algorithm = a
	}
	return l, l.Validate()
}

// Adaptive tunes adaptive limiting; zero fields take the defaults of
// adaptive.Options.
type Adaptive struct {
	// Controller is the rule: "gradient" (default) or "aimd".
	Controller string `json:"controller,omitempty"`
	// Min is the lowest fraction of the configured counts; default 0.1.
	Min float64 `json:"min,omitempty"`
	// ErrorRate is the upstream error fraction (5xx, 429, timeouts) per
	// interval above which limits shrink; default 0.05.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// Latency is a fixed target for the Quantile of upstream latency; 0
	// sets none.
	Latency algo.Duration `json:"latency,omitempty"`
	// Tolerance is how far above the unloaded latency gradient lets the
	// Quantile rise; default 1.5.
	Tolerance float64 `json:"tolerance,omitempty"`
	// Quantile is the latency quantile; default 0.9.
	Quantile float64 `json:"quantile,omitempty"`
	// Interval is how often signals are judged; default 500ms (aimd: 1s).
	Interval algo.Duration `json:"interval,omitempty"`
	// Decrease multiplies the limits when the upstream struggles (gradient:
	// after cutting them to what the upstream served); default 0.95 (aimd:
	// 0.7).
	Decrease float64 `json:"decrease,omitempty"`
	// Increase is the growth per healthy interval (gradient: the first
	// probe, doubling; aimd: added to the factor); default 0.05.
	Increase float64 `json:"increase,omitempty"`
	// MinSamples is the fewest responses per interval that can show
	// trouble; default 10.
	MinSamples int64 `json:"min_samples,omitempty"`
}

// Options returns s as controller options (not yet validated).
func (s *Adaptive) Options() adaptive.Options {
	return adaptive.Options{
		Controller: s.Controller, Tolerance: s.Tolerance, MinFactor: s.Min, ErrorRate: s.ErrorRate, LatencyTarget: time.Duration(s.Latency), Quantile: s.Quantile,
		Interval: time.Duration(s.Interval), Decrease: s.Decrease, Increase: s.Increase, MinSamples: s.MinSamples,
	}
}

// Policy is one named policy as configured: how requests are keyed and
// its stacked limits.
type Policy struct {
	// Name names the policy in headers, metrics and placeholders. Policies
	// with the same name and limits share counters across handlers and
	// survive config reloads.
	Name string `json:"name"`
	// Key is the request's key, a template the adapter fills (its
	// gateway's placeholders); empty means the adapter's default.
	Key string `json:"key,omitempty"`
	// EmptyKey is what happens to a request without a key: "skip" (the
	// default: the policy does not apply) or "shared" (one bucket for all).
	EmptyKey string `json:"empty_key,omitempty"`
	// Limits are stacked: a request passes only if all allow it.
	Limits []Limit `json:"limits"`
	// Cost is the units each request takes; default 1.
	Cost int64 `json:"cost,omitempty"`
	// Shadow decides and reports (headers, metrics, logs) but never denies.
	Shadow bool `json:"shadow,omitempty"`
	// Adaptive, if set, scales the policy's limits with the upstream's
	// health: down when its errors or latency pass their targets, back up
	// while it is healthy.
	Adaptive *Adaptive `json:"adaptive,omitempty"`
	// Plans, instead of Limits, choose the limits per request: Plan is the
	// request's value naming its plan (a template the adapter fills, as
	// Key), DefaultPlan the plan of a request whose value names none. Every
	// limited plan has limits of the same windows and algorithms (their
	// counts and bursts differ), so a key keeps its usage when its plan
	// changes.
	Plan        string `json:"plan,omitempty"`
	Plans       []Plan `json:"plans,omitempty"`
	DefaultPlan string `json:"default_plan,omitempty"`
	// ClearKeys shows the policy's keys in clear to operators (the heaviest
	// denied keys); by default they are hashed (core.KeyHash).
	ClearKeys bool `json:"clear_keys,omitempty"`
	// Charge, if set, charges the policy's limits what each response costs,
	// after it, instead of charging each request as it arrives (all its
	// limits, or only those marked AfterResponse): a request passes while
	// they have a unit left.
	Charge *Charge `json:"charge,omitempty"`
	// Penalty, if set, refuses a key for a while once the policy's limits
	// have denied it often (see Penalty).
	Penalty *Penalty `json:"penalty,omitempty"`
	// Reserve, if set, holds a share of every limit back for requests of a
	// priority at or above its level; Priority is the request's priority,
	// a template the adapter fills (a whole number; anything else is 0).
	Reserve  *Reserve `json:"reserve,omitempty"`
	Priority string   `json:"priority,omitempty"`
}

// Reserve holds Share (between 0 and 1) of each of a policy's limits back
// for requests of priority For or above: lower priorities are refused once
// usage passes the rest (core.Reserve).
type Reserve struct {
	Share float64 `json:"share"`
	For   int     `json:"for"`
}

// ParsePriority reads a request's priority: a whole number, or 0 for
// anything else (a request cannot claim a reserve with a value it garbles).
func ParsePriority(v string) int {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0
	}
	return n
}

// Penalty is a penalty box: once a policy's limits have denied a key
// Denials times within one Within window (aligned to the Unix epoch),
// every request of the key is refused For, with Retry-After its end.
type Penalty struct {
	Denials int64         `json:"denials"`
	Within  algo.Duration `json:"within"`
	For     algo.Duration `json:"for"`
}

// Limit returns the penalty box as the last limit of a policy, checked;
// errors name the field and value.
func (s *Penalty) Limit() (algo.Limit, error) {
	l := algo.PenaltyLimit(s.Denials, time.Duration(s.Within), time.Duration(s.For))
	if s.Denials < 1 {
		return l, fmt.Errorf("penalty denials: %d must be at least 1", s.Denials)
	}
	if err := l.Normalize(); err != nil {
		return l, fmt.Errorf("penalty %w", err)
	}
	return l, nil
}

// Plan is one plan of a policy: its stacked limits, or unlimited.
type Plan struct {
	// Name is the value that selects the plan (a label in headers and
	// metrics, so the plans bound their cardinality).
	Name   string  `json:"name"`
	Limits []Limit `json:"limits,omitempty"`
	// Unlimited lets the plan's requests through, uncounted.
	Unlimited bool `json:"unlimited,omitempty"`
}

// Check validates s without building it; errors name the field and value.
func (s *Policy) Check() ([]algo.Limit, error) {
	if strings.TrimSpace(s.Name) == "" {
		return nil, at("name", fmt.Errorf("policy name: must not be empty"))
	}
	switch {
	case len(s.Plans) > 0 && len(s.Limits) > 0:
		return nil, at("plans", fmt.Errorf("policy %q: limits and plans: give one or the other (a plan holds its own limits)", s.Name))
	case len(s.Plans) > 0:
		return nil, s.checkPlans()
	case s.DefaultPlan != "" || s.Plan != "":
		field := "default_plan"
		if s.Plan != "" {
			field = "plan"
		}
		return nil, at(field, fmt.Errorf("policy %q: plan and default_plan need plans", s.Name))
	case len(s.Limits) == 0:
		return nil, at("limits", fmt.Errorf("policy %q: needs at least one limit", s.Name))
	case len(s.Limits) > core.MaxLimits:
		return nil, at(fmt.Sprintf("limits[%d]", core.MaxLimits), fmt.Errorf("policy %q: %d limits, at most %d may be stacked", s.Name, len(s.Limits), core.MaxLimits))
	}
	if err := CheckCost(s.Cost); err != nil {
		return nil, at("cost", fmt.Errorf("policy %q cost: %w", s.Name, err))
	}
	if s.Priority != "" && s.Reserve == nil {
		return nil, at("priority", fmt.Errorf("policy %q priority: %q chooses nothing without a reserve", s.Name, s.Priority))
	}
	if _, err := gate.ParseEmptyKey(s.EmptyKey); err != nil {
		return nil, at("empty_key", fmt.Errorf("policy %q empty_key: %w", s.Name, err))
	}
	limits := make([]algo.Limit, len(s.Limits))
	for i := range s.Limits {
		l, err := s.Limits[i].Limit()
		if err != nil {
			return nil, atRule(fmt.Sprintf("limits[%d]", i), err, fmt.Errorf("policy %q limit %d: %w", s.Name, i+1, err))
		}
		limits[i] = l
	}
	if err := s.chargeAfterResponse(limits); err != nil {
		return nil, err
	}
	if err := checkDuplicateLimits(s.Name, limits); err != nil {
		return nil, err
	}
	if s.Adaptive != nil {
		if err := s.Adaptive.Options().Validate(); err != nil {
			return nil, at("adaptive", fmt.Errorf("policy %q %w", s.Name, err))
		}
		for i := range limits {
			if err := checkAdaptable(&limits[i]); err != nil {
				return nil, at(fmt.Sprintf("limits[%d]", i), fmt.Errorf("policy %q limit %d (%s): %w", s.Name, i+1, limits[i].Rate(), err))
			}
		}
	}
	return s.withPenalty(limits)
}

// withPenalty returns limits with the policy's penalty box, if any, last.
func (s *Policy) withPenalty(limits []algo.Limit) ([]algo.Limit, error) {
	if s.Penalty == nil {
		return limits, nil
	}
	if len(limits) >= core.MaxLimits {
		return nil, at("penalty", fmt.Errorf("policy %q: %d limits and a penalty, at most %d may be stacked (the penalty is one)", s.Name, len(limits), core.MaxLimits))
	}
	l, err := s.Penalty.Limit()
	if err != nil {
		return nil, at("penalty", fmt.Errorf("policy %q %w", s.Name, err))
	}
	return append(limits, l), nil
}

// chargeAfterResponse marks every limit AfterResponse when the policy has
// a Charge and marks none itself, and checks that marked limits have a
// Charge to take.
func (s *Policy) chargeAfterResponse(limits []algo.Limit) error {
	marked := false
	for i := range limits {
		marked = marked || limits[i].AfterResponse
	}
	if s.Charge == nil {
		if marked {
			return at("charge", fmt.Errorf("policy %q after_response: needs the policy's charge (which responses cost what)", s.Name))
		}
		return nil
	}
	if _, err := s.Charge.Compile(); err != nil {
		return at("charge", fmt.Errorf("policy %q %w", s.Name, err))
	}
	for i := range limits {
		if !marked {
			limits[i].AfterResponse = true
		}
		if err := limits[i].Normalize(); err != nil {
			return atRule(fmt.Sprintf("limits[%d]", i), err, fmt.Errorf("policy %q limit %d (%s): %w", s.Name, i+1, limits[i].Rate(), err))
		}
	}
	return nil
}

// checkAdaptable refuses to adapt a limit that admits a window's count at
// once (fixed_window, sliding_log, sliding_counter): scaled by a factor,
// it still lets each window's count through in a burst, which an upstream
// serving a steady rate refuses, so the controller cannot find the
// upstream's capacity (in bench/adaptive's rate-capacity model: 0.15 to
// 0.54 of it, with up to 63% failing). GCRA, the token bucket, the leaky
// bucket and in-flight limits admit a steady rate or a concurrency, which
// a factor scales.
func checkAdaptable(l *algo.Limit) error {
	switch l.Algorithm {
	case algo.FixedWindow, algo.SlidingLog, algo.SlidingCounter:
		return fmt.Errorf("adaptive limits need gcra, token_bucket, leaky_bucket or in_flight: %s admits a window's count at once, which no factor turns into the steady rate an upstream serves", l.Algorithm)
	}
	return nil
}

// checkDuplicateLimits refuses two limits of one policy that count alike
// (same algorithm, window, burst and max delay): only the smaller count
// can ever decide, so the other is a mistake (a line written twice, or a
// changed count whose old line stayed).
func checkDuplicateLimits(policy string, limits []algo.Limit) error {
	for j := range limits {
		for i := 0; i < j; i++ {
			a, b := &limits[i], &limits[j]
			if a.Algorithm == b.Algorithm && a.Window == b.Window && a.Burst == b.Burst && a.MaxDelay == b.MaxDelay {
				return at(fmt.Sprintf("limits[%d]", j), fmt.Errorf("policy %q limits %d (%d/%s) and %d (%d/%s): the same algorithm over the same window, so only the smaller count ever decides; keep one",
					policy, i+1, a.Count, algo.FormatWindow(a.Window), j+1, b.Count, algo.FormatWindow(b.Window)))
			}
		}
	}
	return nil
}

// checkPlans validates a policy with plans (Check returns no limits for
// it: each plan has its own).
func (s *Policy) checkPlans() error {
	plain := *s
	plain.Plans, plain.Plan, plain.DefaultPlan = nil, "", ""
	seen := map[string]bool{}
	var first, firstScope string // the first limited plan
	for i, plan := range s.Plans {
		path := fmt.Sprintf("plans[%d]", i)
		switch {
		case plan.Name == "":
			return at(path, fmt.Errorf("policy %q plans: a plan without a name", s.Name))
		case seen[plan.Name]:
			return at(path, fmt.Errorf("policy %q plan %q: named twice", s.Name, plan.Name))
		case plan.Unlimited && len(plan.Limits) > 0:
			return at(path, fmt.Errorf("policy %q plan %q: unlimited and limits: give one or the other", s.Name, plan.Name))
		case !plan.Unlimited && len(plan.Limits) == 0:
			return at(path, fmt.Errorf("policy %q plan %q: needs at least one limit, or unlimited", s.Name, plan.Name))
		}
		seen[plan.Name] = true
		if plan.Unlimited {
			continue
		}
		plain.Limits = plan.Limits
		limits, err := plain.Check()
		if err != nil {
			return at(path, fmt.Errorf("plan %q: %w", plan.Name, err))
		}
		scope, _ := core.PolicyScope(s.Name, limits...)
		if first == "" {
			first, firstScope = plan.Name, scope
		} else if scope != firstScope {
			return at(path, fmt.Errorf("policy %q plan %q: limits of other windows or algorithms than plan %q's (a key keeps its usage when its plan changes only if its plans count the same windows)", s.Name, plan.Name, first))
		}
	}
	if first == "" {
		return at("plans", fmt.Errorf("policy %q plans: every plan is unlimited", s.Name))
	}
	if s.DefaultPlan == "" {
		return at("default_plan", fmt.Errorf("policy %q default_plan: missing (the plan of a request whose value names none)", s.Name))
	}
	if !seen[s.DefaultPlan] {
		return at("default_plan", fmt.Errorf("policy %q default_plan: %q is not one of its plans", s.Name, s.DefaultPlan))
	}
	return nil
}

// buildPlans builds a policy per limited plan, sharing one adaptive
// controller (they count the same windows), and composes them with the
// reserve.
func (s *Policy) buildPlans(owner string) (*core.Family, func(), error) {
	plans := make([]core.Plan, len(s.Plans))
	var releases []func()
	releaseAll := func() {
		for _, r := range releases {
			r()
		}
	}
	for i, plan := range s.Plans {
		plans[i].Name = plan.Name
		if plan.Unlimited {
			continue
		}
		limits := make([]algo.Limit, len(plan.Limits))
		for j := range plan.Limits {
			limits[j], _ = plan.Limits[j].Limit() // checked by Check
		}
		_ = s.chargeAfterResponse(limits)
		limits, _ = s.withPenalty(limits) // checked by Check
		v, release, err := s.build(owner, limits, plan.Name)
		if err != nil {
			releaseAll()
			return nil, func() {}, err
		}
		plans[i].Policy, releases = v, append(releases, release)
	}
	f, err := core.NewPlans(plans, s.DefaultPlan, s.reserve())
	if err != nil {
		releaseAll()
		return nil, func() {}, s.familyError(err)
	}
	return f, releaseAll, nil
}

// reserve is the policy's reserve as core composes it.
func (s *Policy) reserve() *core.Reserve {
	if s.Reserve == nil {
		return nil
	}
	return &core.Reserve{Share: s.Reserve.Share, Level: s.Reserve.For}
}

// familyError is an error of composing the policy's family, at the
// reserve's share when it is the share's.
func (s *Policy) familyError(err error) error {
	var share *core.ReserveShareError
	if errors.As(err, &share) {
		return at("reserve.share", err)
	}
	return fmt.Errorf("policy %q %w", s.Name, err)
}

// build makes one policy (or one plan's variant) of s with limits.
func (s *Policy) build(owner string, limits []algo.Limit, plan string) (*core.Policy, func(), error) {
	release := func() {}
	opts := core.PolicyOptions{Shadow: s.Shadow, Plan: plan, ClearKeys: s.ClearKeys}
	if s.Adaptive != nil {
		scope, err := core.PolicyScope(s.Name, limits...)
		if err != nil {
			return nil, release, err
		}
		o := s.Adaptive.Options()
		o.Paced = paced(limits)
		if opts.Adaptive, release, err = adaptive.Acquire(owner+"|"+scope, o); err != nil {
			return nil, func() {}, fmt.Errorf("policy %q %w", s.Name, err)
		}
	}
	p, err := core.NewPolicy(s.Name, opts, limits...)
	if err != nil {
		release()
		return nil, func() {}, err
	}
	return p, release, nil
}

// paced reports whether every limit lets requests through at a steady
// rate (adaptive.Options.Paced): none counts work in flight.
func paced(limits []algo.Limit) bool {
	for _, l := range limits {
		if l.Algorithm == algo.InFlight {
			return false
		}
	}
	return true
}
