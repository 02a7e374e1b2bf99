package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"hash/maphash"
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
// A Policy does not change once NewPolicy returns it, but for the limits
// in force, which an adaptive controller scales; it is safe for concurrent
// use. Its methods are what users call to read it (Name, Limits, Shadow);
// what a Store implementation needs (the step functions run on a key's
// state, the identities that name it) is on its StoreSide. What a request
// may take instead of it is composed around it, in a Family: other plans'
// policies, the policy below a reserve and the charging twin, all naming
// the same counters in every store (Scope and LimitID come from the name
// and each limit's algorithm and window, never a count), so a key keeps
// its usage across plans, priorities, charges and reloads that change a
// count.
type Policy struct {
	// identity is what the policies a Family composes around p (its
	// charging twin, the policy below its reserve) copy whole: the state
	// they name in a store, and how it is shown.
	identity
	cur atomic.Pointer[limitSet] // the limits in force (scaled by an adaptive controller, else limits)
	// planIndex is p's place among its Family's limited plans, in order
	// (0 without plans).
	planIndex int
	leases    bool // an InFlight limit holds leases
	// charges marks a charging twin (see Family.Charging). oneStep: one
	// plain Step decides (no shadow, no phases), Apply's fast path when
	// there is one limit.
	charges bool
	oneStep bool
}

// identity is a policy's name, configured limits and the state they name in
// a store, with how the policy shows and scales them: built by NewPolicy,
// copied whole into the policies a Family composes around it (its charging
// twin, the policy below its reserve: variant builds all three), so a
// field added here reaches them without another line.
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
	return variant(*ident, false), nil
}

// variant returns a policy of id, the one constructor of every policy
// NewPolicy returns and of those a Family composes around it: the policy
// below a reserve (id's limits short of the share), and the twin that
// charges id's after-response limits (charges true: it only charges, so
// it holds no lease and takes no one-step path). What is derived from the
// identity is derived here, once.
func variant(id identity, charges bool) *Policy {
	p := &Policy{identity: id, charges: charges, oneStep: !charges && !id.shadow && !id.phased}
	for i := range id.limits {
		p.leases = p.leases || (!charges && id.limits[i].Algorithm == algo.InFlight)
	}
	p.use(p.limits, 1)
	return p
}

// AfterResponse reports whether some limit of p is charged after the
// response (see Family.Charging); p may be that charging twin.
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

// Plan returns the name of the plan p's limits are, "" for a policy
// without plans.
func (p *Policy) Plan() string { return p.plan }

// PlanIndex returns p's place among its Family's plans (0 without plans):
// its policies below a reserve and its charging twin share it.
func (p *Policy) PlanIndex() int { return p.planIndex }

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
