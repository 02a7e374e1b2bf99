package config

import (
	"fmt"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// Compiled is a config compiled once: its store and its policies, each
// checked against that store and built, with what a request takes and
// what a response charges. Nothing in it changes after Compile (but an
// adaptive policy's factor, which its controller moves); an adapter opens
// it (Open), holds it for as long as the config is loaded and
// calls Release when it is unloaded.
type Compiled struct {
	// Store is the store the policies run on.
	Store openstore.Config
	// Policies are the compiled policies, in the order given to Compile.
	Policies []CompiledPolicy

	releases []func()
}

// CompiledPolicy is one policy of a Compiled config.
type CompiledPolicy struct {
	// Policy decides.
	Policy *core.Policy
	// EmptyKey is what a request without a key does under the policy.
	EmptyKey gate.EmptyKey
	// Cost is the units one request takes (Policy.Cost, 1 when unset).
	Cost int64
	// Charge is what each response costs the limits charged after it; nil
	// when the policy charges requests as they arrive.
	Charge *gate.ResponseCost
}

// Compile checks and builds policies into a Compiled config for store,
// each check made once with one wording: a policy's own, then whether store
// can decide it (openstore.Config.CheckPolicy: eventual mode counts requests
// only), then the adapter's check, if not nil (what a gateway's own store
// takes). An adaptive policy's controller is shared by every config that
// builds the same policy under the same owner (a gateway's name for the
// process, and the instance's scope when counters are per instance), so a
// reload keeps its factor. Policy names must differ (they name counters,
// headers and metrics). Errors are *PolicyError.
func Compile(owner string, store openstore.Config, check func(*core.Policy) error, policies ...*Policy) (*Compiled, error) {
	compiled := &Compiled{Store: store, Policies: make([]CompiledPolicy, 0, len(policies))}
	seen := make(map[string]bool, len(policies))
	for _, s := range policies {
		if seen[s.Name] {
			compiled.Release()
			return nil, &PolicyError{Index: len(compiled.Policies), Err: fmt.Errorf("policy %q: name used twice", s.Name)}
		}
		seen[s.Name] = true
		c, release, err := s.compile(owner)
		if err == nil {
			if err = store.CheckPolicy(c.Policy); err == nil && check != nil {
				err = check(c.Policy)
			}
			if err != nil {
				release()
			}
		}
		if err != nil {
			compiled.Release()
			return nil, &PolicyError{Index: len(compiled.Policies), Err: err}
		}
		compiled.Policies = append(compiled.Policies, c)
		compiled.releases = append(compiled.releases, release)
	}
	return compiled, nil
}

// PolicyError is an error of Compile's: Err, of the policy at Index in
// the order given (so an adapter can say where it was written).
type PolicyError struct {
	Index int
	Err   error
}

func (e *PolicyError) Error() string { return e.Err.Error() }
func (e *PolicyError) Unwrap() error { return e.Err }

// Release gives back the config's adaptive controllers; its policies
// must no longer decide. Releasing twice is a no-op.
func (p *Compiled) Release() {
	for _, r := range p.releases {
		r()
	}
	p.releases = nil
}

// compile checks s and builds it into a CompiledPolicy; release gives back its
// adaptive controller (a no-op without adaptive).
func (s *Policy) compile(owner string) (CompiledPolicy, func(), error) {
	c := CompiledPolicy{Cost: s.Cost}
	if c.Cost == 0 {
		c.Cost = 1
	}
	limits, err := s.Check()
	if err != nil {
		return c, func() {}, err
	}
	c.EmptyKey, _ = gate.ParseEmptyKey(s.EmptyKey) // checked by Check
	if s.Charge != nil {
		c.Charge, _ = s.Charge.Compile() // checked by Check
	}
	var release func()
	if len(s.Plans) > 0 {
		c.Policy, release, err = s.buildPlans(owner)
	} else {
		c.Policy, release, err = s.build(owner, limits, "")
	}
	return c, release, err
}

// Open opens the store a compiled config runs on (or joins it: see
// Acquire) and returns the config's policies as gate rules over it, in
// order; syncScope, prefixed to each policy's scope, names an adaptive
// policy's shared factor (see Rule). Release the handle when the config
// is unloaded.
func Open(c *Compiled, syncScope string) (*openstore.Handle, []gate.Rule, error) {
	h, err := openstore.Acquire(c.Store)
	if err != nil {
		return nil, nil, err
	}
	rules := make([]gate.Rule, len(c.Policies))
	for i := range c.Policies {
		cp := &c.Policies[i]
		rules[i] = h.Rule(cp.Policy, cp.EmptyKey, syncScope)
		rules[i].Charge = cp.Charge
	}
	return h, rules, nil
}
