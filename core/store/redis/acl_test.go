package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/redis/acl"
	"github.com/tollgate/tollgate/internal/redistest"
)

// TestACLUserRefusedOutsideItsPrefix: a user with acl.Rule (docs/stores.md's
// least-privilege user) serves every store path on the default prefix:
// decisions, reads and resets (one limit and all), leases, eventual
// counts, the adaptive factor and the breaker's PING. Redis refuses it
// anything else: a write or a script outside the prefix, reading other
// keys, administration. (`make test` also runs the Redis suites as this
// user: TOLLGATE_REDIS_ACL.)
func TestACLUserRefusedOutsideItsPrefix(t *testing.T) {
	srv, err := redistest.Start(t.TempDir(), append([]string{"--user", "tollgate"}, strings.Fields(acl.Rule("s3cret", DefaultPrefix))...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	s, err := New(Options{Settings: Settings{Addrs: []string{srv.Addr}, Username: "tollgate", Password: "s3cret", Timeout: algo.Duration(2 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	p := core.MustPolicy("acl", core.PolicyOptions{}, algo.Limit{Count: 3, Window: time.Minute, Algorithm: algo.SlidingLog},
		algo.Limit{Count: 9, Window: time.Hour, Algorithm: algo.FixedWindow}, algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.InFlight})
	var d core.Decision
	steps := []struct {
		what string
		run  func() error
	}{
		{"decide", func() error { return s.Decide(ctx, p, "k", 1, &d) }},
		{"inspect", func() error { return s.Inspect(ctx, p, "k", &d) }},
		{"reset one limit", func() error { return s.Reset(ctx, p, "k", 1) }},
		{"reset", func() error { return s.Reset(ctx, p, "k", core.AllLimits) }},
		{"end a lease", func() error {
			_, _, err := s.EndLease(ctx, &core.Lease{Policy: p, Key: "k", Token: 1, Cost: 1}, false)
			return err
		}},
		{"eventual counts", func() error {
			c := []core.SharedCount{{Policy: p, Key: "k", Limit: 1, Start: 0, Add: 1}}
			if err := s.AddCounts(ctx, c); err != nil {
				return err
			}
			return s.DeleteCounts(ctx, c)
		}},
		{"adaptive factor (aimd)", func() error {
			_, err := s.FactorSync("acl").SyncFactor(ctx, adaptive.Signals{}, true, adaptive.Options{Controller: adaptive.ControllerAIMD, Decrease: 0.5, Increase: 0.1, MinFactor: 0.1, Interval: time.Second})
			return err
		}},
		{"adaptive factor (gradient)", func() error {
			_, err := s.FactorSync("acl2").SyncFactor(ctx, adaptive.Signals{Started: 1, Answered: 1}, false, adaptive.Options{Controller: adaptive.ControllerGradient,
				Decrease: 0.95, Increase: 0.05, MinFactor: 0.1, ErrorRate: 0.05, Tolerance: 1.5, Interval: time.Second, MinSamples: 10})
			return err
		}},
		{"breaker probe", func() error { return s.Ping(ctx) }},
	}
	for _, st := range steps {
		if err := st.run(); err != nil {
			t.Errorf("%s as the least-privilege user: %v", st.what, err)
		}
	}
	as := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: "tollgate", Password: "s3cret"})
	defer as.Close()
	for _, cmd := range [][]any{
		{"set", "elsewhere", "1"},
		{"del", "elsewhere"},
		{"eval", "return redis.call('SET', KEYS[1], 1)", 1, "elsewhere"},
		{"eval", "return redis.call('SET', KEYS[1], 1)", 1, DefaultPrefix + "x"}, // SET is not tollgate's
		{"get", DefaultPrefix + "x"},
		{"keys", "*"},
		{"flushall"},
		{"function", "flush"},
		{"function", "delete", DecideFunction},
		{"config", "get", "*"},
		{"acl", "list"},
	} {
		// A script's refused call is "ERR The user executing the script
		// can't run this command"; the rest are NOPERM.
		if err := as.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't run this command") {
			t.Errorf("%v as the least-privilege user: %v, want it refused", cmd, err)
		}
	}
}
