package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
)

// MaxLimits is the most limits one Policy may stack.
const MaxLimits = 8

// Policy is a named stack of limits applied to one key. A request is allowed
// only if every limit allows it, and a denied request consumes nothing from
// any of them.
//
// A Policy does not change once NewPolicy (or NewPlans) returns it, but
// for the limits in force, which an adaptive controller scales; it is
// safe for concurrent use. Its variants (one per plan, ForPlan; the one
// below a reserve, ForPriority; the charging twin, Charging) name the same
// counters in every store: Scope and LimitID come from the name and each
// limit's algorithm and window, never a count, so a key keeps its usage
// across plans, priorities, charges and reloads that change a count.
// Its methods are what users call: build and read policies (NewPolicy,
// NewPlans, Name, Limits, the variants). What a Store implementation needs
// (the step functions run on a key's state, the identities that name it)
// is on its StoreSide.
type Policy struct {
	// identity is what p's variants (its charging twin, its unreserved
	// variant) copy whole: the state they name in a store, and how it is
	// shown.
	identity
	cur atomic.Pointer[limitSet] // the limits in force (scaled by an adaptive controller, else limits)
	// derived is what a renderer derives from the limits in force (the
	// header fields), kept so it is derived once, not per request.
	derived atomic.Value
	// planIndex is p's place among its policy's limited plans, in order;
	// plans are the policy's variants, one per plan.
	planIndex int
	plans     *planTable
	leases    bool // an InFlight limit holds leases
	// charging is the twin that charges the limits charged after the
	// response (see Charging), and charges marks that twin. oneStep: one
	// plain Step decides (no shadow, no phases), Apply's fast path when
	// there is one limit.
	charging *Policy
	charges  bool
	oneStep  bool
	// unreserved is the variant requests below reserveLevel take (see
	// ForPriority), nil without a reserve.
	unreserved *Policy
}

// identity is a policy's name, configured limits and the state they name in
// a store, with how the policy shows and scales them: built by NewPolicy,
// copied whole into the policy's charging twin and its unreserved variant
// (variant builds all three), so a field added here reaches them without
// another line.
type identity struct {
	name string
	// limits are the configured limits.
	limits []algo.Limit
	adapt  *adaptive.Controller
	shadow bool
	// scope names the policy's state in a store: its name plus each limit's
	// identity (algorithm and window, never the count), so a reloaded policy
	// finds its counters again even when a count, burst or delay changed:
	// raising a customer's quota keeps what was used, as gateways' own counters do.
	scope     string
	idleUS    int64
	scopeHash uint64
	nameHash  uint64
	limitIDs  []string
	// plan names the plan these limits are ("" for a policy without plans).
	plan      string
	clearKeys bool
	// phased: some limit is charged after the response (AfterResponse).
	phased bool
	// penalty is the index of the Penalty limit, -1 without one.
	penalty int
	// reserveLevel is the priority level at or above which requests may
	// use the reserve (0 without one).
	reserveLevel int
}

// planTable is a policy's plans: the variant for each plan name (nil for an
// unlimited plan), shared by every variant.
type planTable struct {
	byName      map[string]*Policy
	names       []string // as declared
	defaultPlan string
}

// scopeSeed and nameSeed hash a policy's scope and its name, once per
// policy, for the stores' indexes.
var scopeSeed, nameSeed = maphash.MakeSeed(), maphash.MakeSeed()

// limitSet is a set of limits in force.
type limitSet struct {
	limits []algo.Limit
	factor float64 // the adaptive factor they were scaled by
}

// PolicyOptions holds a Policy's optional settings.
type PolicyOptions struct {
	// Shadow makes the policy decide and report but always allow.
	Shadow bool
	// Adaptive, if set, scales every limit's count (and explicit burst) by
	// the controller's factor. Counters carry over as the factor moves: the
	// policy's identity in stores is its configured limits.
	Adaptive *adaptive.Controller
	// Plan names the plan these limits are (see NewPlans): it shows in the
	// RateLimit headers' item names, placeholders and metrics, never in the
	// identity of the counters, so a key keeps its usage when its plan
	// changes.
	Plan string
	// ClearKeys shows the policy's keys as they are in what operators read
	// (the heaviest denied keys, logs); by default they are shown as
	// KeyHash, since keys can be API keys.
	ClearKeys bool
	// Reserve, between 0 and 1, holds that share of every limit's quota
	// back for requests of priority ReserveLevel or above: a request below
	// it is refused once usage passes the rest (see ForPriority and
	// algo.Limit.Unreserved).
	Reserve      float64
	ReserveLevel int
}

// NewPolicy validates limits and returns a policy named name. Errors name the
// limit (by position and rate) and the field at fault.
func NewPolicy(name string, opts PolicyOptions, limits ...algo.Limit) (*Policy, error) {
	if name == "" {
		return nil, fmt.Errorf("policy name: must not be empty")
	}
	if len(limits) == 0 {
		return nil, fmt.Errorf("policy %q: needs at least one limit", name)
	}
	if len(limits) > MaxLimits {
		return nil, fmt.Errorf("policy %q: %d limits, at most %d may be stacked", name, len(limits), MaxLimits)
	}
	ident := &identity{name: name, shadow: opts.Shadow, adapt: opts.Adaptive, limits: make([]algo.Limit, len(limits)), plan: opts.Plan,
		clearKeys: opts.ClearKeys, penalty: -1}
	var sig strings.Builder
	sig.WriteString(name)
	for i, l := range limits {
		if err := l.Normalize(); err != nil {
			return nil, fmt.Errorf("policy %q limit %d (%s): %w", name, i+1, l.Rate(), err)
		}
		ident.limits[i] = l
		ident.idleUS = max(ident.idleUS, l.IdleMicros())
		ident.phased = ident.phased || l.AfterResponse
		if l.Algorithm == algo.Penalty {
			if ident.penalty >= 0 {
				return nil, fmt.Errorf("policy %q limit %d (%s): a second penalty; a policy has at most one", name, i+1, l.Rate())
			}
			ident.penalty = i
		}
		id := limitIdentity(limits[:i], l)
		sig.WriteString("|" + id)
		h := fnv.New64a()
		h.Write([]byte(id))
		ident.limitIDs = append(ident.limitIDs, strconv.FormatUint(h.Sum64(), 36))
	}
	if ident.penalty >= 0 && len(limits) == 1 {
		return nil, fmt.Errorf("policy %q: a penalty counts the denials of the policy's other limits, and it has none", name)
	}
	ident.scope = sig.String()
	ident.scopeHash = maphash.String(scopeSeed, ident.scope)
	ident.nameHash = maphash.String(nameSeed, name)
	if opts.Reserve != 0 {
		if err := CheckReserveShare(opts.Reserve); err != nil {
			return nil, fmt.Errorf("policy %q %w", name, err)
		}
		ident.reserveLevel = opts.ReserveLevel
	}
	var charging *Policy
	if ident.phased {
		charging = variant(*ident, nil, true)
	}
	pol := variant(*ident, charging, false)
	if opts.Reserve != 0 {
		// The same state as pol's (the same identity, kept as long), and
		// charged after the response as pol is (a charge takes no reserve
		// into account).
		u := *ident
		u.limits = make([]algo.Limit, len(ident.limits))
		for i := range ident.limits {
			u.limits[i] = ident.limits[i].Unreserved(opts.Reserve)
		}
		pol.unreserved = variant(u, charging, false)
	}
	return pol, nil
}

// variant returns a policy of id, the one constructor of every policy
// NewPolicy returns and of its variants: a policy and its unreserved
// variant (charging is their twin that charges id's after-response limits,
// nil when id has none), and that twin itself (charges true: it only
// charges, so it holds no lease and takes no one-step path). What is
// derived from the identity is derived here, once.
func variant(id identity, charging *Policy, charges bool) *Policy {
	p := &Policy{identity: id, charging: charging, charges: charges, oneStep: !charges && !id.shadow && !id.phased}
	for i := range id.limits {
		p.leases = p.leases || (!charges && id.limits[i].Algorithm == algo.InFlight)
	}
	p.use(p.limits, 1)
	return p
}

// ForPriority returns the variant of p a request of priority level takes:
// p itself at or above its reserve's level (or without a reserve), else the
// variant whose limits leave the reserved share alone (they count in the
// same state).
func (p *Policy) ForPriority(level int) *Policy {
	if p.unreserved == nil || level >= p.reserveLevel {
		return p
	}
	return p.unreserved
}

// Reserved returns the variant of p that holds a reserve back, and the
// level at or above which requests may use it; nil without a reserve.
func (p *Policy) Reserved() (unreserved *Policy, level int) { return p.unreserved, p.reserveLevel }

// Charging returns the policy under which a store charges the response's
// cost to p's limits charged after the response (algo.Limit.AfterResponse),
// or nil when p has none. A Store.Decide under it, with the response's cost
// (see algo.Charge), takes that cost from those limits whatever they have
// left, changes no other limit, and reports each limit as a request of cost
// 0 sees it after the charge: Allowed false where the charge overdrew a
// limit, with its RetryAfter. Under p itself, those limits only check that
// a unit is left (algo.Check) and charge nothing. Both name the same
// state, so a store needs nothing more to charge after the response.
func (p *Policy) Charging() *Policy { return p.charging }

// AfterResponse reports whether some limit of p is charged after the
// response (see Charging); p may be that charging twin.
func (p *Policy) AfterResponse() bool { return p.phased }

// limitIdentity names a validated limit's counters: its algorithm and
// window, never its count (nor burst or delay), so raising a limit keeps
// what was used. A second limit with the same algorithm and window in one
// policy (before: the limits before it) is numbered apart.
func limitIdentity(before []algo.Limit, l algo.Limit) string {
	window := strconv.FormatInt(int64(l.Window/time.Microsecond), 10)
	if l.CalendarMonths() > 0 {
		window = algo.FormatWindow(l.Window) // "1mo", "1y": not a 30d window's
	}
	id := l.Algorithm.String() + ":" + window
	n := 0
	for _, b := range before {
		if b.Algorithm == l.Algorithm && b.WindowMicros() == l.WindowMicros() && b.CalendarMonths() == l.CalendarMonths() {
			n++
		}
	}
	if n > 0 {
		id += "#" + strconv.Itoa(n)
	}
	return id
}

// PolicyScope returns the Scope of a policy named name with these limits
// without building one, so state kept beside policies (an adaptive
// controller shared across reloads) can be keyed like their counters.
func PolicyScope(name string, limits ...algo.Limit) (string, error) {
	sig := name
	for i, l := range limits {
		if err := l.Normalize(); err != nil {
			return "", fmt.Errorf("policy %q limit %d (%s): %w", name, i+1, l.Rate(), err)
		}
		sig += "|" + limitIdentity(limits[:i], l)
	}
	return sig, nil
}

// NewPlans joins variants of one policy, one per plan (the same name and
// limits of the same algorithms and windows, so the same counters; counts
// and bursts differ), into one policy whose limits are chosen per request
// (ForPlan). names lists the plans in order; a nil variant is an unlimited
// plan. It returns the default plan's variant, or the first limited one
// when the default is unlimited: the policy a gate rule holds.
func NewPlans(names []string, variants []*Policy, defaultPlan string) (*Policy, error) {
	t := &planTable{byName: map[string]*Policy{}, names: names, defaultPlan: defaultPlan}
	var base *Policy
	limited := 0
	for i, name := range names {
		v := variants[i]
		if _, dup := t.byName[name]; dup {
			return nil, fmt.Errorf("plan %q: named twice", name)
		}
		t.byName[name] = v
		if v == nil {
			continue
		}
		if base != nil && (v.scope != base.scope || v.name != base.name) {
			return nil, fmt.Errorf("plan %q: limits of other windows or algorithms than plan %q's (a key keeps its usage when its plan changes only if its plans count the same windows)", name, base.plan)
		}
		if base == nil || name == defaultPlan {
			base = v
		}
		v.plans, v.planIndex = t, limited
		if v.charging != nil {
			v.charging.planIndex = limited
		}
		if v.unreserved != nil {
			v.unreserved.planIndex = limited
		}
		limited++
	}
	if _, ok := t.byName[defaultPlan]; !ok {
		return nil, fmt.Errorf("default plan %q: not one of the plans (%s)", defaultPlan, strings.Join(names, ", "))
	}
	if base == nil {
		return nil, fmt.Errorf("plans: every plan is unlimited")
	}
	return base, nil
}

// Plan returns the name of the plan p's limits are, "" for a policy
// without plans.
func (p *Policy) Plan() string { return p.plan }

// Plans returns the policy's plan names in order, nil without plans.
func (p *Policy) Plans() []string {
	if p.plans == nil {
		return nil
	}
	return p.plans.names
}

// ForPlan returns the variant of p whose limits a request of plan name
// takes: the default plan's for an empty or unknown name (a request cannot
// be refused for the value it sends), and false for an unlimited plan. A
// policy without plans is its own variant.
func (p *Policy) ForPlan(name string) (*Policy, bool) {
	if p.plans == nil {
		return p, true
	}
	v, ok := p.plans.byName[name]
	if !ok {
		v = p.plans.byName[p.plans.defaultPlan]
	}
	return v, v != nil
}

// FirstPlan returns the first of names that names one of p's plans, or ""
// (the default plan): how a consumer's tags choose its plan.
func (p *Policy) FirstPlan(names []string) string {
	for _, name := range names {
		if slices.Contains(p.Plans(), name) {
			return name
		}
	}
	return ""
}

// PlanIndex returns p's place among Variants.
func (p *Policy) PlanIndex() int { return p.planIndex }

// Variants returns the limited plans' variants in order (p alone without
// plans).
func (p *Policy) Variants() []*Policy {
	if p.plans == nil {
		return []*Policy{p}
	}
	var vs []*Policy
	for _, name := range p.plans.names {
		if v := p.plans.byName[name]; v != nil {
			vs = append(vs, v)
		}
	}
	return vs
}

// use puts limits, the configured ones scaled by factor, in force.
func (p *Policy) use(limits []algo.Limit, factor float64) *limitSet {
	set := &limitSet{limits: limits, factor: factor}
	p.cur.Store(set)
	return set
}

// current returns the limits in force, rescaled first if the adaptive
// factor moved. Rescaling on read, not on the controller's signal, leaves
// nothing registered with a controller that outlives the policy (it is
// shared across config reloads).
func (p *Policy) current() *limitSet {
	set := p.cur.Load()
	if p.adapt != nil {
		if f := p.adapt.Factor(); f != set.factor {
			// Concurrent rescales build equal sets; the last one stays.
			set = p.use(algo.ScaleLimits(p.limits, f), f)
		}
	}
	return set
}

// ShownName is the name the policy's limits go by where clients see them:
// its name, and its plan's after a dash ("api-gold").
func (p *Policy) ShownName() string {
	if p.plan != "" {
		return p.name + "-" + p.plan
	}
	return p.name
}

// Adaptive returns the policy's controller, or nil.
func (p *Policy) Adaptive() *adaptive.Controller { return p.adapt }

// Configured returns the limits as configured, before adaptive scaling.
func (p *Policy) Configured() []algo.Limit { return p.limits }

// MustPolicy is NewPolicy for limits known to be valid; it panics on error.
func MustPolicy(name string, opts PolicyOptions, limits ...algo.Limit) *Policy {
	p, err := NewPolicy(name, opts, limits...)
	if err != nil {
		panic(err)
	}
	return p
}

// Name returns the policy's name.
func (p *Policy) Name() string { return p.name }

// Limits returns the limits in force (defaults filled in; scaled by the
// adaptive factor, if any). The caller must not modify them.
func (p *Policy) Limits() []algo.Limit { return p.current().limits }

// NumLimits returns how many limits the policy stacks: len(Limits()),
// without loading the limits in force.
func (p *Policy) NumLimits() int { return len(p.limits) }

// HoldsLeases reports whether p has an InFlight limit: a request it allows
// holds a lease until its gateway ends it (see Limiter.Lease).
func (p *Policy) HoldsLeases() bool { return p.leases }

// Shadow reports whether the policy only reports and always allows.
func (p *Policy) Shadow() bool { return p.shadow }

// ShowKey is key as operators see it: in clear if the policy says so, else
// KeyHash(key).
func (p *Policy) ShowKey(key string) string {
	if p.clearKeys {
		return key
	}
	return KeyHash(key)
}

// KeyHash is how a key is shown unless its policy shows keys in clear
// (keys can be API keys): the first 12 hex digits of its SHA-256, stable
// across nodes and restarts, so an operator can match it to a key they
// hash themselves (printf %s "$KEY" | sha256sum | cut -c1-12).
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:6])
}

// CheckReserveShare checks a reserve's share of each limit (a fraction,
// 0 < share < 1), in the one wording every adapter reports.
func CheckReserveShare(share float64) error {
	if !(share > 0 && share < 1) {
		return fmt.Errorf("reserve: a share of %g must be between 0 and 1, both excluded", share)
	}
	return nil
}

// Derived is a slot for a value derived from the policy and its limits in
// force (the header renderer keeps its fields there, with the limits they
// were derived from), so it is derived once, not per request.
func (p *Policy) Derived() *atomic.Value { return &p.derived }
