package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/eventual"
	"github.com/tollgate/tollgate/core/store/failover"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/core/store/storetest"
	"github.com/tollgate/tollgate/internal/redistest"
)

// The conformance suite on every store and every composition of stores, each
// checked decision for decision against the reference model.

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Main(m, &standalone, &cluster))
}

// newRedis returns a Redis store on a fresh key prefix, closed with the test.
func newRedis(t *testing.T, opts redis.Options) *redis.Store {
	t.Helper()
	opts.Prefix = fmt.Sprintf("t%d:%s:", time.Now().UnixNano(), t.Name())
	switch { // TOLLGATE_REDIS_ACL: the least-privilege user
	case len(opts.Addrs) == 1 && opts.Addrs[0] == standalone.Addr:
		opts.Username, opts.Password = standalone.User, standalone.Password
	case opts.Cluster && len(opts.Addrs) > 0 && opts.Addrs[0] == cluster.Addrs()[0]:
		opts.Username, opts.Password = cluster.User, cluster.Password
	}
	s, err := redis.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return memory.MustNew(memory.Options{Clock: clock})
	})
}

func TestConformanceRedisStandalone(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return newRedis(t, redis.Options{Settings: redis.Settings{Addrs: []string{standalone.Addr}}, Clock: clock, NoDenyCache: true})
	})
}

func TestConformanceRedisCluster(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return newRedis(t, redis.Options{Settings: redis.Settings{Addrs: cluster.Addrs()}, Cluster: true, Clock: clock, NoDenyCache: true})
	})
}

// The deny cache answers denials from states it holds; the suite must see
// it answer (local denials counted), not only Redis.
func TestConformanceRedisDenyCache(t *testing.T) {
	var stores []*redis.Store
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		s := newRedis(t, redis.Options{Settings: redis.Settings{Addrs: []string{standalone.Addr}}, Clock: clock})
		stores = append(stores, s)
		return s
	})
	var local int64
	for _, s := range stores {
		local += s.LocalDenials()
	}
	if local == 0 {
		t.Fatal("the deny cache answered no request: the suite did not exercise it")
	}
	t.Logf("%d decisions answered by the deny cache", local)
}

// syncedEventual is eventual mode synced after every decision: it must then
// decide exactly as Redis does.
type syncedEventual struct{ *eventual.Store }

func (s syncedEventual) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	if err := s.Store.Decide(ctx, p, key, cost, d); err != nil {
		return err
	}
	return s.Sync(ctx)
}

func TestConformanceEventualSyncedEveryStep(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		e, err := eventual.New(newRedis(t, redis.Options{Settings: redis.Settings{Addrs: []string{standalone.Addr}}}), eventual.Options{Clock: clock, Manual: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return syncedEventual{e}
	}, storetest.Options{Algorithms: []algo.Algorithm{algo.FixedWindow, algo.SlidingCounter}})
}

// deadStore is a shared store that never answers.
type deadStore struct{}

var errDead = errors.New("connection refused")

func (deadStore) Decide(context.Context, *core.Policy, string, int64, *core.Decision) error {
	return errDead
}
func (deadStore) Ping(context.Context) error { return errDead }

// The failover store with its shared store dead: every decision after the
// breaker opens comes from the fallback memory store.
func TestConformanceFailoverFallback(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		f, err := failover.New(deadStore{}, failover.Options{Local: memory.MustNew(memory.Options{Clock: clock}), Failures: 1, ProbeEvery: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return fallbackOnly{f}
	})
}

// fallbackOnly checks that every decision it passes on was the fallback's.
type fallbackOnly struct{ *failover.Store }

func (f fallbackOnly) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	if err := f.Store.Decide(ctx, p, key, cost, d); err != nil {
		return err
	}
	if !d.Fallback {
		return errors.New("decision not marked Fallback with the shared store dead")
	}
	return nil
}
