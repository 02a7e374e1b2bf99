package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/redis/acl"
	"github.com/tollgate/tollgate/core/store/storetest"
	"github.com/tollgate/tollgate/internal/redistest"
)

// holdsLibrary says whether the server at addr holds DecideLibrary.
func holdsLibrary(t *testing.T, addr string) bool {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	libs, err := c.FunctionList(context.Background(), goredis.FunctionListQuery{LibraryNamePattern: DecideFunction}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(libs) == 1 && libs[0].Name == DecideFunction
}

// deleteLibrary removes DecideLibrary from the server at addr, as an
// operator's FUNCTION FLUSH or a node that joins a Cluster leaves it.
func deleteLibrary(t *testing.T, addr string) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	if err := c.FunctionDelete(context.Background(), DecideFunction).Err(); err != nil && !strings.Contains(err.Error(), "not found") {
		t.Fatal(err)
	}
}

// Decisions are FCALLs of the library, which the store loads into every
// server that lacks it (each primary of a Cluster), as the least-privilege
// user when the suite runs as it.
func TestDecidesWithTheLibrary(t *testing.T) {
	p := core.MustPolicy("fn", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Hour, Algorithm: algo.FixedWindow})
	for _, tc := range []struct {
		name  string
		opts  Options
		nodes []*redistest.Server
	}{
		{"standalone", Options{Settings: Settings{Addrs: []string{standalone.Addr}}}, []*redistest.Server{standalone}},
		{"cluster", Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true}, cluster.Nodes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range tc.nodes {
				deleteLibrary(t, n.Addr)
			}
			before := make([]int64, len(tc.nodes))
			for i, n := range tc.nodes {
				before[i], _, _ = n.CommandStats("fcall")
			}
			s := newStore(t, tc.opts)
			ctx := context.Background()
			for i, want := range []bool{true, true, false} {
				var d core.Decision
				if err := s.Decide(ctx, p, "k", 1, &d); err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want {
					t.Fatalf("request %d allowed %v, want %v", i+1, d.Allowed, want)
				}
			}
			if s.Scripted() {
				t.Fatal("the store fell back to the script")
			}
			var calls int64
			for i, n := range tc.nodes {
				if !holdsLibrary(t, n.Addr) {
					t.Errorf("%s does not hold the library", n.Addr)
				}
				after, _, err := n.CommandStats("fcall")
				if err != nil {
					t.Fatal(err)
				}
				calls += after - before[i]
			}
			// (Another test's store may call the shared server too.)
			if calls < 3 {
				t.Fatalf("%d FCALLs for 3 decisions", calls)
			}
		})
	}
}

// scriptsUser is the least-privilege user without FCALL and FUNCTION
// LOAD: its store decides with the script.
func scriptsUser(t *testing.T, addr, name string) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	rule := strings.Fields(strings.Replace(acl.Rule(redistest.ACLTestPassword, "t"), " +fcall +function|load ", " ", 1))
	if err := c.Do(context.Background(), append([]any{"acl", "setuser", name, "reset"}, toAny(rule)...)...).Err(); err != nil {
		t.Fatal(err)
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Where Redis takes no functions — an ACL without FCALL or FUNCTION LOAD,
// a server that knows no FCALL (Redis 6, here one that renamed it away) —
// the store decides with the script, exactly as the suite's model does.
func TestConformanceWhereFunctionsAreRefused(t *testing.T) {
	t.Run("acl without fcall", func(t *testing.T) {
		scriptsUser(t, standalone.Addr, "scripts-only")
		var stores []*Store
		storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
			o := Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Clock: clock, NoDenyCache: true}
			o.Prefix = fmt.Sprintf("t%d:%s:", time.Now().UnixNano(), t.Name())
			o.Username, o.Password = "scripts-only", redistest.ACLTestPassword
			s, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			stores = append(stores, s)
			return s
		})
		for _, s := range stores {
			if !s.Scripted() {
				t.Fatal("a store kept calling the library its user may not call")
			}
		}
	})
	for _, tc := range []struct{ name, why string }{
		{"acl without function load", "fcall"},
		{"no fcall command", "renamed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.why == "renamed" {
				extra = []string{"--rename-command", "FCALL", ""}
			}
			srv, err := redistest.Start(t.TempDir(), extra...)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Stop()
			opts := Options{Settings: Settings{Addrs: []string{srv.Addr}}}
			if tc.why == "fcall" {
				// May call the library, may not load it: the server lacks it.
				scriptsUser(t, srv.Addr, "no-load")
				c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
				defer c.Close()
				if err := c.Do(context.Background(), "acl", "setuser", "no-load", "+fcall").Err(); err != nil {
					t.Fatal(err)
				}
				opts.Username, opts.Password = "no-load", redistest.ACLTestPassword
			}
			opts.Prefix = "t:"
			s, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			p := core.MustPolicy("fn", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Hour, Algorithm: algo.SlidingLog})
			for i, want := range []bool{true, true, false} {
				var d core.Decision
				if err := s.Decide(context.Background(), p, "k", 1, &d); err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want {
					t.Fatalf("request %d allowed %v, want %v", i+1, d.Allowed, want)
				}
			}
			if !s.Scripted() {
				t.Fatal("the store did not fall back to the script")
			}
		})
	}
}

// losing decides like batches, but first deletes the library from one of
// nodes every third batch, turning from node to node: on a Cluster a
// pipeline then finds it on some primaries and not on others.
type losing struct {
	batches
	t     *testing.T
	nodes []string
	sent  *int
}

func (s losing) DecideBatch(ctx context.Context, reqs []storetest.Request, ds []core.Decision) []error {
	if *s.sent%3 == 0 {
		deleteLibrary(s.t, s.nodes[*s.sent/3%len(s.nodes)])
	}
	*s.sent++
	return s.batches.DecideBatch(ctx, reqs, ds)
}

// A server that lost the library (FUNCTION FLUSH, a primary new to a
// Cluster) refuses the calls sent to it before running them: they go
// again once it is loaded, and the batch's calls another node ran are not
// decided twice.
func TestConformanceLibraryLost(t *testing.T) {
	run := func(t *testing.T, opts Options, nodes []string) {
		sent, multi := 0, 0
		storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
			o := opts
			o.Clock, o.NoDenyCache = clock, true
			return losing{batches{newStore(t, o), &multi}, t, nodes, &sent}
		}, storetest.Options{Batch: 8})
		if sent < 3*len(nodes) || multi == 0 {
			t.Fatalf("%d batches (%d of several requests): the library was not lost from every node", sent, multi)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		run(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}}, []string{standalone.Addr})
	})
	t.Run("cluster", func(t *testing.T) {
		run(t, Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true}, cluster.Addrs())
	})
}

// The refusals of FCALL that send the store to the script: Redis 6's, a
// proxy's, an ACL's; not a missing library, nor the code's own errors.
func TestRefusesFunctions(t *testing.T) {
	for msg, want := range map[string]bool{
		"ERR unknown command 'FCALL', with args beginning with: 'tollgate_decide_x' '1' ": true,
		"ERR unknown command `fcall`, with args beginning with: ":                         true,
		"ERR unsupported command 'fcall'":                                                 true,
		"NOPERM User tollgate has no permissions to run the 'fcall' command":              true,
		"ERR Function not found":                                                          false,
		"WRONGTYPE Operation against a key holding the wrong kind of value":               false,
		"ERR tollgate: a stored state is unreadable (not written by tollgate)":            false,
		"NOPERM No permissions to access a key":                                           false,
	} {
		if got := refusesFunctions(errors.New(msg)); got != want {
			t.Errorf("refusesFunctions(%q) = %v, want %v", msg, got, want)
		}
	}
}
