package gate

import (
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// DenialSampler lets at most a number of denial log lines a second
// through, so a flood of denials writes a bounded log. It is a fixed
// window decided by Step, like any other limit, and counts what it drops.
type DenialSampler struct {
	mu      sync.Mutex
	limit   algo.Limit
	state   algo.State
	clock   core.Clock
	dropped int64
}

// NewDenialSampler returns a sampler of perSecond lines, or nil (logging
// nothing) when perSecond is 0.
func NewDenialSampler(perSecond int) *DenialSampler {
	if perSecond <= 0 {
		return nil
	}
	l := algo.Limit{Count: int64(perSecond), Window: time.Second, Algorithm: algo.FixedWindow}
	_ = l.Normalize()
	return &DenialSampler{limit: l, clock: core.NewMonotonicClock()}
}

// Log logs outcome's denial with printf if Sample lets it through: the
// policy, the deciding limit, the key as the policy shows it (its
// identifier in scope, hashed unless in clear), the retry-after and how
// many denials were not logged before it.
func (s *DenialSampler) Log(outcome *Outcome, scope Scope, printf func(format string, args ...any)) {
	if ok, dropped := s.Sample(); ok {
		d := &outcome.Decision
		printf("tollgate: rate limited policy=%q limit=%q key=%q retry_after=%s not_logged=%d", d.Policy.Name(),
			d.DecidingLimit().Label(), d.Policy.ShowKey(scope.Identifier(outcome.Key)), d.RetryAfter, dropped)
	}
}

// Sample reports whether a denial may be logged now and, if so, how many
// denials were not logged since the last line.
func (s *DenialSampler) Sample() (ok bool, dropped int64) {
	if s == nil {
		return false, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var r algo.Result
	s.state, r = algo.Step(&s.limit, s.state, s.clock.NowMicros(), 1)
	if !r.Allowed {
		s.dropped++
		return false, 0
	}
	dropped, s.dropped = s.dropped, 0
	return true, dropped
}

// Scope is where one config's keys live among a process's configs (a
// gateway's plugin instance, say): Name shows it to operators, in log
// lines and the operators' API, and Prefix begins each of its keys in the
// store. The zero Scope is a config alone in its store.
type Scope struct {
	Name, Prefix string
}

// Key is the store key of identifier in the scope.
func (s Scope) Key(identifier string) string { return s.Prefix + identifier }

// Identifier is key without the scope's prefix: the identifier Key made
// it from, as operators give it.
func (s Scope) Identifier(key string) string { return strings.TrimPrefix(key, s.Prefix) }
