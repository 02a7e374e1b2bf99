package redis

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/storetest"
	"github.com/tollgate/tollgate/internal/redistest"
)

// batches decides the random traces' runs of requests as a lane sends a
// batch it gathered: one EVALSHA of the script's batch form on standalone
// and Sentinel, a pipeline of single EVALSHAs on a Cluster.
type batches struct {
	*Store
	multi *int // batches of more than one request sent
}

// testCall is a call deciding key under p, as Decide queues it.
func testCall(s *Store, p *core.Policy, key string, cost, now int64) *call {
	c := &call{policy: p, cost: cost, now: now}
	c.keys.Set(s.prefix, p, key)
	return c
}

func (s batches) DecideBatch(ctx context.Context, reqs []storetest.Request, ds []core.Decision) []error {
	calls := make([]*call, len(reqs))
	for i, r := range reqs {
		calls[i] = testCall(s.Store, r.Policy, r.Key, r.Cost, r.At)
	}
	s.batch.send(calls, s.timeout)
	if len(calls) > 1 {
		*s.multi++
	}
	errs := make([]error, len(reqs))
	for i, c := range calls {
		errs[i] = c.err
		if c.err == nil {
			_, errs[i] = fill(reqs[i].Policy, reqs[i].Cost, c.reply, &ds[i])
		}
	}
	return errs
}

func TestConformanceBatches(t *testing.T) {
	run := func(t *testing.T, opts Options, scripted bool) {
		var stores []*Store
		multi := 0
		storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
			o := opts
			o.Clock, o.NoDenyCache = clock, true
			s := newStore(t, o)
			stores = append(stores, s)
			return batches{s, &multi}
		}, storetest.Options{Batch: 8})
		if multi == 0 {
			t.Fatal("no batch held more than one request: the suite did not exercise batches")
		}
		for _, s := range stores {
			if s.batch.scripted.Load() != scripted {
				t.Fatalf("batches sent as one script: %v, want %v", s.batch.scripted.Load(), scripted)
			}
		}
		t.Logf("%d batches of 2 to 8 requests", multi)
	}
	t.Run("standalone", func(t *testing.T) { run(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}}, true) })
	t.Run("cluster", func(t *testing.T) { run(t, Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true}, false) })
	t.Run("sentinel", func(t *testing.T) {
		sentinel, err := redistest.StartSentinel(t.TempDir(), "tollgate-master", standalone)
		if err != nil {
			t.Fatal(err)
		}
		defer sentinel.Stop()
		run(t, Options{Settings: Settings{Master: "tollgate-master", Addrs: []string{sentinel.Addr}}}, true)
	})
}

var batchPolicy = core.MustPolicy("batch", core.PolicyOptions{},
	algo.Limit{Count: 2, Window: time.Hour, Algorithm: algo.FixedWindow},
	algo.Limit{Count: 3, Window: time.Hour, Algorithm: algo.SlidingLog})

// decideAll sends one batch of a request for each key, at Redis's TIME,
// and returns each request's decision and error.
func decideAll(s *Store, keys ...string) ([]core.Decision, []error) {
	reqs := make([]storetest.Request, len(keys))
	for i, k := range keys {
		reqs[i] = storetest.Request{Policy: batchPolicy, Key: k, Cost: 1, At: -1}
	}
	ds := make([]core.Decision, len(keys))
	return ds, batches{s, new(int)}.DecideBatch(context.Background(), reqs, ds)
}

// A request whose key Redis cannot read (here, not a hash) fails alone:
// the batch's other requests are decided, and decided once.
func TestBatchRequestErrorStaysItsOwn(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	admin := adminClient(t)
	if err := admin.Set(context.Background(), s.stateKey(batchPolicy, "broken"), "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for round, wantAllowed := range []bool{true, true, false} {
		ds, errs := decideAll(s, "a", "broken", "b", "a")
		if errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") {
			t.Fatalf("round %d: the broken key's error is %v, want WRONGTYPE", round, errs[1])
		}
		for _, i := range []int{0, 2} {
			if errs[i] != nil {
				t.Fatalf("round %d, request %d: %v beside a broken key", round, i, errs[i])
			}
		}
		// "a" is asked twice per round, "b" once: fixed window 2 per hour.
		if round == 0 && (!ds[0].Allowed || !ds[3].Allowed || ds[3].Remaining != 0) {
			t.Fatalf("round 0: key a allowed %v then %v (remaining %d), want two allowed, none left", ds[0].Allowed, ds[3].Allowed, ds[3].Remaining)
		}
		if round > 0 && ds[0].Allowed {
			t.Fatalf("round %d: key a allowed a third time in its window", round)
		}
		if ds[2].Allowed != wantAllowed {
			t.Fatalf("round %d: key b allowed %v, want %v (two per hour)", round, ds[2].Allowed, wantAllowed)
		}
	}
	if !s.batch.scripted.Load() {
		t.Fatal("one request's error turned batching off")
	}
}

// A server that refuses a batch but decides its requests one by one (here a
// Cluster node, which refuses a script over keys of several slots, reached
// as a standalone server) gets them one by one, once, and no batch again.
func TestBatchRefusedGoesOneByOne(t *testing.T) {
	node := cluster.Addrs()[0]
	s := newStore(t, Options{Settings: Settings{Addrs: []string{node}, Username: cluster.User, Password: cluster.Password}})
	// Two keys whose slots (different ones) this node serves.
	admin := adminCluster(t)
	shards, err := admin.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	serves := func(slot int64) bool {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				for _, n := range sh.Nodes {
					if r.Start <= slot && slot <= r.End && n.Role == "master" && net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)) == node {
						return true
					}
				}
			}
		}
		return false
	}
	var keys []string
	var taken []int64
	nodeClient := goredis.NewClient(&goredis.Options{Addr: node})
	defer nodeClient.Close()
	for i := 0; len(keys) < 2 && i < 1000; i++ {
		k := "k" + strconv.Itoa(i)
		slot, err := nodeClient.ClusterKeySlot(context.Background(), s.stateKey(batchPolicy, k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if serves(slot) && (len(taken) == 0 || taken[0] != slot) {
			keys, taken = append(keys, k), append(taken, slot)
		}
	}
	if len(keys) < 2 {
		t.Fatalf("found %d keys this node serves", len(keys))
	}
	ds, errs := decideAll(s, keys[0], keys[1], keys[0], keys[0])
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if !ds[0].Allowed || !ds[1].Allowed || !ds[2].Allowed || ds[3].Allowed {
		t.Fatalf("allowed %v %v %v %v, want the first three (2 per hour for %s)", ds[0].Allowed, ds[1].Allowed, ds[2].Allowed, ds[3].Allowed, keys[0])
	}
	if s.batch.scripted.Load() {
		t.Fatal("still batching in one script after the server refused it")
	}
}

// A call that waited in the queue past the store's timeout fails without
// being sent; the batch's others are decided.
func TestBatchFailsCallsQueuedPastTimeout(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}, Timeout: algo.Duration(time.Second)}})
	now := s.batch.clock.NowMicros()
	fresh := testCall(s, batchPolicy, "fresh", 1, -1)
	fresh.queued = now
	stale := testCall(s, batchPolicy, "stale", 1, -1)
	stale.queued = now - 2_000_000
	s.batch.sendInTime([]*call{stale, fresh})
	if !errors.Is(stale.err, context.DeadlineExceeded) {
		t.Fatalf("a call queued 2 s ago with a 1 s timeout: err %v, want context.DeadlineExceeded", stale.err)
	}
	if fresh.err != nil || len(fresh.reply) == 0 {
		t.Fatalf("the fresh call beside it: reply %v, err %v", fresh.reply, fresh.err)
	}
	n, err := adminClient(t).Exists(context.Background(), s.stateKey(batchPolicy, "stale")).Result()
	if err != nil || n != 0 {
		t.Fatalf("the stale call's key exists (%d, %v): it was sent", n, err)
	}
}

// A batch's flat answer is split into each call's reply or own error; an
// answer of any other shape (a lying or broken server) fails every call
// of the batch, and never panics.
func TestBatchAnswerSplit(t *testing.T) {
	calls := func(n int) []*call {
		batch := make([]*call, n)
		for i := range batch {
			batch[i] = &call{}
		}
		return batch
	}
	batch := calls(3)
	if err := split([]any{int64(2), int64(7), int64(1), int64(-1), "WRONGTYPE no", int64(1), int64(9)}, batch); err != nil {
		t.Fatal(err)
	}
	if r := batch[0].reply; len(r) != 2 || r[0] != 7 || r[1] != 1 || batch[0].err != nil {
		t.Fatalf("first call: %v %v", r, batch[0].err)
	}
	if batch[1].err == nil || batch[1].err.Error() != "WRONGTYPE no" || batch[1].reply != nil {
		t.Fatalf("second call: %v %v, want its own error", batch[1].reply, batch[1].err)
	}
	if r := batch[2].reply; len(r) != 1 || r[0] != 9 || batch[2].err != nil {
		t.Fatalf("third call: %v %v", r, batch[2].err)
	}
	for _, bad := range [][]any{
		{},                                   // no reply at all
		{int64(2), int64(7)},                 // a reply cut short
		{int64(1), int64(7), int64(1)},       // a value past the last reply
		{int64(1), "7"},                      // a string where a value belongs
		{"1", int64(7)},                      // a string where a length belongs
		{int64(-2), int64(7)},                // a negative length
		{int64(-1)},                          // an error without its message
		{int64(1 << 40), int64(7), int64(8)}, // a length past the answer
		{int64(1), int64(7), int64(-1), "e"}, // two requests' answer for one
	} {
		if err := split(bad, calls(1)); err == nil {
			t.Errorf("answer %v for one request: no error", bad)
		}
	}
}
