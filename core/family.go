package core

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tollgate/tollgate/core/algo"
)

// Family is a policy and what a request may take instead of it, composed
// around it: a policy per plan (one name, limits of the same algorithms
// and windows, so the same counters; counts and bursts differ), chosen
// by the request's plan; for each, the policy a request below a reserve's
// priority takes (its limits short of the reserved share, on the same
// counters); and the twin that charges a response's cost to its limits
// charged after the response. A policy alone is a Family of one
// (NewFamily). A policy belongs to one family (its PlanIndex is its place
// there). A Family does not change once made; it is safe for concurrent
// use.
type Family struct {
	members     []member       // the limited plans', in order
	byName      map[string]int // a plan's member, -1 for an unlimited plan
	names       []string       // as declared; nil without plans
	defaultPlan string
	base        int // the default plan's member, or the first limited one
	level       int // the reserve's level (0 without one)
}

// member is one plan's policy and the policies composed around it.
type member struct {
	policy   *Policy
	below    *Policy // below the reserve's level; nil without a reserve
	charging *Policy // charges its after-response limits; nil without any
}

// Plan is one plan of a Family: its name, and its policy (nil: unlimited,
// nothing counted).
type Plan struct {
	Name   string
	Policy *Policy
}

// Reserve holds Share (0 < Share < 1) of each limit of a Family's
// policies back for requests of priority Level or above: a request below
// it is refused once usage passes the rest (algo.Limit.Unreserved).
type Reserve struct {
	Share float64
	Level int
}

// CheckReserveShare checks a reserve's share of each limit (a fraction,
// 0 < share < 1), in the one wording every adapter reports; its error is
// a *ReserveShareError.
func CheckReserveShare(share float64) error {
	if !(share > 0 && share < 1) {
		return &ReserveShareError{share}
	}
	return nil
}

// ReserveShareError is a reserve's share out of its range (see
// CheckReserveShare).
type ReserveShareError struct{ Share float64 }

func (e *ReserveShareError) Error() string {
	return fmt.Sprintf("reserve: a share of %g must be between 0 and 1, both excluded", e.Share)
}

// NewFamily composes p, a policy without plans, with reserve (nil: none)
// and its charging twin.
func NewFamily(p *Policy, reserve *Reserve) (*Family, error) {
	f := &Family{}
	return f, f.add(p, reserve)
}

// NewPlans composes plans, in order, into a Family whose policies a
// request chooses by its plan (For): every limited plan's policy has the
// same name and limits of the same algorithms and windows (so the same
// counters); defaultPlan is the plan of a request whose plan names none.
// Each plan's policy gets reserve (nil: none) and its charging twin.
func NewPlans(plans []Plan, defaultPlan string, reserve *Reserve) (*Family, error) {
	f := &Family{byName: map[string]int{}, defaultPlan: defaultPlan, base: -1}
	for _, plan := range plans {
		if _, dup := f.byName[plan.Name]; dup {
			return nil, fmt.Errorf("plan %q: named twice", plan.Name)
		}
		f.names = append(f.names, plan.Name)
		f.byName[plan.Name] = -1
		v := plan.Policy
		if v == nil {
			continue
		}
		if f.base >= 0 {
			if b := f.members[f.base].policy; v.scope != b.scope || v.name != b.name {
				return nil, fmt.Errorf("plan %q: limits of other windows or algorithms than plan %q's (a key keeps its usage when its plan changes only if its plans count the same windows)", plan.Name, b.plan)
			}
		}
		if f.base < 0 || plan.Name == defaultPlan {
			f.base = len(f.members)
		}
		f.byName[plan.Name] = len(f.members)
		if err := f.add(v, reserve); err != nil {
			return nil, err
		}
	}
	if _, ok := f.byName[defaultPlan]; !ok {
		return nil, fmt.Errorf("default plan %q: not one of the plans (%s)", defaultPlan, strings.Join(f.names, ", "))
	}
	if f.base < 0 {
		return nil, fmt.Errorf("plans: every plan is unlimited")
	}
	return f, nil
}

// add makes p the family's next member, with the policies composed around
// it; they share its place (PlanIndex).
func (f *Family) add(p *Policy, reserve *Reserve) error {
	m := member{policy: p}
	if p.planIndex != len(f.members) {
		// Written only when it changes: a policy alone, composed again
		// by each gate it serves, is read concurrently.
		p.planIndex = len(f.members)
	}
	if p.phased {
		m.charging = variant(p.identity, true)
		m.charging.planIndex = p.planIndex
	}
	if reserve != nil {
		if err := CheckReserveShare(reserve.Share); err != nil {
			return fmt.Errorf("policy %q %w", p.name, err)
		}
		// The same state as p's (the same identity, kept as long), and
		// charged after the response by p's twin (a charge takes no
		// reserve into account).
		u := p.identity
		u.limits = make([]algo.Limit, len(p.limits))
		for i := range p.limits {
			u.limits[i] = p.limits[i].Unreserved(reserve.Share)
		}
		m.below = variant(u, false)
		m.below.planIndex = p.planIndex
		f.level = reserve.Level
	}
	f.members = append(f.members, m)
	return nil
}

// Policy returns the default plan's policy, or the first limited plan's
// when the default is unlimited: the one that names the family's
// counters, and the policy of a family without plans.
func (f *Family) Policy() *Policy { return f.members[f.base].policy }

// Names returns the plan names in order, nil without plans.
func (f *Family) Names() []string { return f.names }

// For returns the policy a request of plan (the default plan's for an
// empty or unknown name: a request cannot be refused for the value it
// sends) and of priority takes, and false for an unlimited plan.
func (f *Family) For(plan string, priority int) (*Policy, bool) {
	i := f.base
	if f.names != nil {
		var ok bool
		if i, ok = f.byName[plan]; !ok {
			i = f.byName[f.defaultPlan]
		}
		if i < 0 {
			return nil, false
		}
	}
	m := &f.members[i]
	if m.below != nil && priority < f.level {
		return m.below, true
	}
	return m.policy, true
}

// Charging returns the twin under which a store charges a response's
// cost to p's limits charged after the response (algo.Limit.AfterResponse),
// p being one of the family's policies (or one below its reserve), or
// nil when p has none. A Store.Decide under it, with the response's cost
// (see algo.Charge), takes that cost from those limits whatever they have
// left, changes no other limit, and reports each limit as a request of
// cost 0 sees it after the charge: Allowed false where the charge
// overdrew a limit, with its RetryAfter. Under p itself, those limits
// only check that a unit is left (algo.Check) and charge nothing. Both
// name the same state, so a store needs nothing more to charge after the
// response.
func (f *Family) Charging(p *Policy) *Policy {
	if m := f.memberOf(p); m != nil {
		return m.charging
	}
	return nil
}

// memberOf returns the member p is the policy of (or the policy below the
// reserve of), nil when p is not the family's.
func (f *Family) memberOf(p *Policy) *member {
	if p.planIndex < len(f.members) {
		if m := &f.members[p.planIndex]; m.policy == p || m.below == p {
			return m
		}
	}
	return nil
}

// Below returns the policy that requests below the reserve's priority
// take instead of p (one of the family's plans' policies), and the
// reserve's level; nil without a reserve.
func (f *Family) Below(p *Policy) (below *Policy, level int) {
	if m := f.memberOf(p); m != nil && m.policy == p && m.below != nil {
		return m.below, f.level
	}
	return nil, 0
}

// First returns the first of names that names one of the plans, or ""
// (the default plan): how a consumer's tags choose its plan.
func (f *Family) First(names []string) string {
	for _, name := range names {
		if slices.Contains(f.names, name) {
			return name
		}
	}
	return ""
}

// Plans returns the limited plans' policies in order (the policy alone
// without plans); a policy's PlanIndex is its place here.
func (f *Family) Plans() []*Policy {
	ps := make([]*Policy, len(f.members))
	for i := range f.members {
		ps[i] = f.members[i].policy
	}
	return ps
}

// All returns every policy a decision of the family may name: each
// plan's, the one below its reserve and its charging twin.
func (f *Family) All() []*Policy {
	var all []*Policy
	for _, m := range f.members {
		for _, p := range []*Policy{m.policy, m.below, m.charging} {
			if p != nil {
				all = append(all, p)
			}
		}
	}
	return all
}
