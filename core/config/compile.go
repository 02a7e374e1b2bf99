package config

import (
	"errors"
	"fmt"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/openstore"
)

// Setup is a whole gate config as an adapter hands it over: its
// policies, its store and how it answers, as written.
type Setup struct {
	// Owner shares an adaptive policy's controller among every config
	// that builds the same policy under the same owner (a gateway's name
	// for the process, and the instance's scope when counters are per
	// instance), so a reload keeps its factor.
	Owner string
	// Policies are the config's policies, in order; at least one.
	Policies []*Policy
	// Store is the store as written; nil takes StoreConfig.
	Store *Store
	// StoreConfig is the store when Store is nil: one the adapter built
	// from settings of its own (its zero value is the memory store).
	StoreConfig openstore.Config
	// Response is how denials are answered; Headers empty takes
	// DefaultStyle, and StyleNames are the adapter's own names of header
	// styles (headers.ParseStyle).
	Response     Response
	DefaultStyle headers.Style
	StyleNames   map[string]headers.Style
	// Check, if not nil, is what the adapter's own store adds to the
	// checks of each policy, each plan's on its own (run after the
	// store's).
	Check func(*core.Policy) error
}

// Compiled is a config compiled once: its store, how it answers and its
// policies, each checked against that store and built, with what a
// request takes and what a response charges. Nothing in it changes after
// Compile (but an adaptive policy's factor, which its controller moves);
// an adapter opens it (Open), holds it for as long as the config is
// loaded and calls Release when it is unloaded.
type Compiled struct {
	// Store is the store the policies run on.
	Store openstore.Config
	// Policies are the compiled policies, in the order given to Compile.
	Policies []CompiledPolicy
	// Gate is the gate's settings but its rules (Open adds them).
	Gate gate.Config
	// LogDenials is how many denials a second are logged (0: none).
	LogDenials int

	releases []func()
}

// CompiledPolicy is one policy of a Compiled config.
type CompiledPolicy struct {
	// Policy decides (the default plan's, for a policy with plans).
	Policy *core.Policy
	// Family is the policy composed with what a request may take instead
	// of it: its other plans' policies, the policy below its reserve, its
	// charging twin.
	Family *core.Family
	// EmptyKey is what a request without a key does under the policy.
	EmptyKey gate.EmptyKey
	// Cost is the units one request takes (Policy.Cost, 1 when unset).
	Cost int64
	// Charge is what each response costs the limits charged after it; nil
	// when the policy charges requests as they arrive.
	Charge *gate.ResponseCost
}

// Compile checks and builds a whole config, each rule checked once, here,
// with one wording: the response side, the store, then each policy: its
// own rules, whether the store can decide it (openstore.Config.CheckPolicy:
// eventual mode counts requests only), then the adapter's Check. Policy
// names must differ (they name counters, headers and metrics). Errors are
// *Error, saying which policy and field.
func Compile(s Setup) (*Compiled, error) {
	compiled := &Compiled{Policies: make([]CompiledPolicy, 0, len(s.Policies))}
	var err error
	if compiled.Gate, compiled.LogDenials, err = s.Response.gateConfig(s.DefaultStyle, s.StyleNames); err != nil {
		return nil, configError(-1, err)
	}
	compiled.Store = s.StoreConfig
	if s.Store != nil {
		if compiled.Store, err = s.Store.Config(); err != nil {
			return nil, configError(-1, at("store", err))
		}
	}
	if len(s.Policies) == 0 {
		return nil, configError(-1, at("policies", errors.New("policies: need at least one policy")))
	}
	seen := make(map[string]bool, len(s.Policies))
	for i, p := range s.Policies {
		if p == nil {
			compiled.Release()
			return nil, configError(i, errors.New("policies: null policy"))
		}
		if seen[p.Name] {
			compiled.Release()
			return nil, configError(i, at("name", fmt.Errorf("policy %q: name used twice", p.Name)))
		}
		seen[p.Name] = true
		c, release, err := p.compile(s.Owner)
		if err == nil {
			// Each plan's policy, checked on its own.
			for _, v := range c.Family.Plans() {
				if err = compiled.Store.CheckPolicy(v); err == nil && s.Check != nil {
					err = s.Check(v)
				}
				if err != nil {
					release()
					break
				}
			}
		}
		if err != nil {
			compiled.Release()
			return nil, configError(i, err)
		}
		compiled.Policies = append(compiled.Policies, c)
		compiled.releases = append(compiled.releases, release)
	}
	return compiled, nil
}

// Error is a config's error: Err, of the policy at Policy in the order
// given (-1 for the config's store or response side), at Field, its path
// in the config's JSON below the policy ("limits[1]", "charge.status") or
// the config ("store.timeout", "status"); "" when no one field is at
// fault. Rule is the check's own words, without the policy's name and
// place that Err adds. An adapter maps Policy and Field to where they
// were written (a config file's line, its own field path) and says Err,
// or Rule after its own name of the field.
type Error struct {
	Policy int
	Field  string
	Err    error
	Rule   error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// fieldError is an error at a path, below what checked it; rule is the
// check's own words (err without the policy's name and place).
type fieldError struct {
	path      string
	err, rule error
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// at says err is at path; a path err already carries is below it
// (at("plans[1]", an error at "limits[0]") is at "plans[1].limits[0]"),
// and so are its rule's words.
func at(path string, err error) error {
	rule := err
	var inner *fieldError
	if errors.As(err, &inner) {
		if inner.path != "" {
			path += "." + inner.path
		}
		rule = inner.rule
	}
	return &fieldError{path: path, err: err, rule: rule}
}

// atRule is at for err, which says the policy's name and place around
// rule, the check's own words.
func atRule(path string, rule, err error) error {
	return &fieldError{path: path, err: err, rule: rule}
}

// configError makes err an *Error of the policy at index (-1: none),
// its field found where at put it.
func configError(index int, err error) *Error {
	e := &Error{Policy: index, Err: err, Rule: err}
	var fe *fieldError
	if errors.As(err, &fe) {
		e.Field, e.Rule = fe.path, fe.rule
	}
	return e
}

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
		if c.Family, release, err = s.buildPlans(owner); err == nil {
			c.Policy = c.Family.Policy()
		}
		return c, release, err
	}
	if c.Policy, release, err = s.build(owner, limits, ""); err != nil {
		return c, release, err
	}
	if c.Family, err = core.NewFamily(c.Policy, s.reserve()); err != nil {
		release()
		return c, func() {}, s.familyError(err)
	}
	return c, release, nil
}

// Opened is a compiled config's gate over its opened store.
type Opened struct {
	// Gate decides requests, one rule per policy, in order.
	Gate *gate.Gate
	// Store is the store the rules decide on; Release gives it back.
	Store *openstore.Handle
}

// Open opens the store c runs on (or joins it: see openstore.Acquire) and
// makes c's gate over it, one rule per policy; syncScope, prefixed to each
// policy's scope, names an adaptive policy's shared factor (see
// openstore.Handle.Rule). Release the store when the config is unloaded.
func (c *Compiled) Open(syncScope string) (Opened, error) {
	h, err := openstore.Acquire(c.Store)
	if err != nil {
		return Opened{}, err
	}
	cfg := c.Gate
	cfg.Rules = make([]gate.Rule, len(c.Policies))
	for i := range c.Policies {
		cp := &c.Policies[i]
		cfg.Rules[i] = h.Rule(cp.Policy, cp.EmptyKey, syncScope)
		cfg.Rules[i].Family, cfg.Rules[i].Charge = cp.Family, cp.Charge
	}
	g, err := gate.New(cfg)
	if err != nil {
		_ = h.Release()
		return Opened{}, err
	}
	return Opened{Gate: g, Store: h}, nil
}
