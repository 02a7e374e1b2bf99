package core_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// mapStore is a store of one's own: each key's states in a map under one
// lock, decided by the policy's own step functions (its StoreSide).
type mapStore struct {
	mu     sync.Mutex
	clock  core.Clock
	states map[string][]algo.State
}

func (s *mapStore) Decide(_ context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	ps := p.StoreSide()
	s.mu.Lock()
	defer s.mu.Unlock()
	id := ps.Scope() + "\x00" + key // the policy's counters for key
	states, ok := s.states[id]
	if !ok {
		states = make([]algo.State, p.NumLimits()) // a new key: zero states
		s.states[id] = states
	}
	// Decides, fills d, and keeps the new states only if every limit allowed.
	ps.Apply(states, s.clock.NowMicros(), cost, d)
	return nil
}

// ExampleStoreSide decides on a store of one's own (mapStore): what a
// store needs of a policy is its StoreSide. docs/go.md shows this code.
func ExampleStoreSide() {
	clock := &core.ManualClock{Micros: 1_700_006_400_000_000}
	store := &mapStore{clock: clock, states: map[string][]algo.State{}}
	policy := core.MustPolicy("api", core.PolicyOptions{},
		algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
	limiter := core.NewLimiter(policy, store)
	for i := 0; i < 3; i++ {
		d, _ := limiter.Allow(context.Background(), "alice")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// true 1 0s
	// true 0 0s
	// false 0 1m0s
}
