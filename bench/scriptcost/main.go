// Command scriptcost measures, inside one real redis-server, what each part
// of one request's decision in redis.DecideLua costs: it runs each part 20,000
// times in one EVAL (over 10,000 keys, the script's own definitions loaded)
// and reads Redis's TIME around the loop, so no network or client cost is
// counted. It prints µs per run, the best of three, with the empty loop
// first (its cost is in every other line). The first of the three runs of
// decide writes each key's expiry; the others find it far enough ahead and
// skip the PEXPIRE, as most writes of a busy key do. The last parts time
// the calls a layout tollgate does not use, a string per state read by one
// MGET per batch, would make in place of HMGET and HSET.
//
// Then what one call costs whatever it decides: Redis's own time per
// EVALSHA or FCALL (INFO commandstats, which counts the command's
// execution, not its network) over 20,000 calls made one after another,
// the best of three: a script that returns at once, the decide script's
// definitions alone (everything before its entry points, which every
// script call runs again), one request decided by a whole script call,
// a function that returns at once, and one request decided by the
// library's function, which the store calls where Redis takes functions.
// A gateway whose batches are small (few requests waiting at once) pays
// the call's fixed cost on nearly every decision.
package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	tgredis "github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/internal/redistest"
)

const runs = 20_000

// loop runs PART once per iteration with KEYS[1] a state hash and KEYS[2]
// its (unused) sorted set, as one 1-limit GCRA request's keys.
const loop = `
local policy = {limits = read_limits(0, 1), ttl = 2000}
local packed = pack(1700000000000000, 12345, 0, 1700000000000)
local ns, nr, batch = {}, {}, {}
local t = redis.call('TIME')
local t0 = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = t0
for i = 1, RUNS do
  KEYS[1] = 'tollgate:{scriptcost:client-' .. (i % 10000) .. '}'
  KEYS[2] = KEYS[1] .. ':limit'
  PART
end
t = redis.call('TIME')
return tonumber(t[1]) * 1000000 + tonumber(t[2]) - t0
`

var parts = []struct{ name, lua string }{
	{"the loop alone", ""},
	{"one request's decide (1 GCRA limit)", "local ok, e = pcall(decide, policy.limits, 0, now, 1, policy.ttl, {}, 0); if not ok then return redis.error_reply(tostring(e.err or e)) end"},
	{"HMGET of the state (and with it the hash's expiry)", "redis.call('HMGET', KEYS[1], unpack(policy.limits.fields))"},
	{"HSET of the state", "redis.call('HSET', KEYS[1], 'a', packed)"},
	{"PEXPIRE", "redis.call('PEXPIRE', KEYS[1], 2000)"},
	{"reading a packed state", "local s = parse(packed, {})"},
	{"packing a state", "local x = pack(1700000000000000, 12345, 0, 1700000000000)"},
	{"reading a text state (earlier releases' form)", "local s = parse('1700000000000000 12345 0', {})"},
	{"formatting a text state (%d)", "local x = string.format('%d %d %d', 1700000000000000, 12345, 0)"},
	{"the GCRA step", "local s, r = gcra(policy.limits[1], {1700000000000000, 12345, 0}, now, 1, ns, nr)"},
	// A layout this release does not use, a string per state: what its
	// calls would cost in place of HMGET and HSET (the key's own string,
	// beside its hash).
	{"(a string per state) SET of the state, with its expiry", "redis.call('SET', KEYS[1] .. ':s', packed, 'PX', 2000000)"},
	{"(a string per state) SET of the state", "redis.call('SET', KEYS[1] .. ':s', packed, 'KEEPTTL')"},
	{"(a string per state) GET of the state", "redis.call('GET', KEYS[1] .. ':s')"},
	{"(a string per state) MGET of 26 states, its share", "batch[i % 26 + 1] = KEYS[1] .. ':s'; if i % 26 == 0 then redis.call('MGET', unpack(batch)) end"},
}

func main() {
	dir, err := os.MkdirTemp("", "tollgate-scriptcost-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := redistest.Start(dir)
	check(err)
	defer srv.Stop()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer c.Close()
	// The decide script's definitions: everything before its entry points.
	defs := tgredis.DecideLua[:strings.Index(tgredis.DecideLua, "local BATCH = -2")]
	body := strings.Replace(loop, "RUNS", fmt.Sprint(runs), 1)
	// One GCRA limit: 1,000,000 per second, burst 1,000,000.
	args := []any{int(algo.GCRA), 1_000_000, 1_000_000, 1_000_000, 0, 0, "a"}
	fmt.Printf("µs per run, best of 3, %d runs each\n", runs)
	for _, part := range parts {
		best := int64(1) << 62
		for r := 0; r < 3; r++ {
			us, err := c.Eval(context.Background(), defs+strings.Replace(body, "PART", part.lua, 1), []string{"k", "k:limit"}, args...).Int64()
			check(err)
			best = min(best, us)
		}
		fmt.Printf("%6.2f  %s\n", float64(best)/runs, part.name)
	}

	// One request's whole call, as the store sends it.
	store := tgredis.NewFromClient(c, tgredis.Options{})
	defer store.Close()
	policy := core.MustPolicy("scriptcost", core.PolicyOptions{}, algo.Limit{Count: 1_000_000, Window: time.Second, Algorithm: algo.GCRA, Burst: 1_000_000})
	calls := []struct{ name, command, code string }{
		{"a script that returns at once", "evalsha", "return 0"},
		{"the decide script's definitions alone", "evalsha", defs + "\nreturn 0"},
		{"one request (1 GCRA limit), the whole script", "evalsha", tgredis.DecideLua},
		{"a function that returns at once", "fcall", "#!lua name=scriptcost_empty\nredis.register_function('scriptcost_empty', function() return 0 end)"},
		{"one request (1 GCRA limit), the library's function (as the store calls it)", "fcall", tgredis.DecideLibrary},
	}
	fmt.Printf("\nµs of Redis's time per call (commandstats), best of 3, %d calls one after another\n", wholeCalls)
	for _, call := range calls {
		run := func(keys []string, args []any) error { return nil }
		switch call.command {
		case "evalsha":
			sha, err := c.ScriptLoad(context.Background(), call.code).Result()
			check(err)
			run = func(keys []string, args []any) error {
				return c.EvalSha(context.Background(), sha, keys, args...).Err()
			}
		case "fcall":
			name, err := c.FunctionLoad(context.Background(), call.code).Result()
			check(err)
			run = func(keys []string, args []any) error { return c.FCall(context.Background(), name, keys, args...).Err() }
		}
		best := math.MaxFloat64
		for r := 0; r < 3; r++ {
			calls0, usec0, err := srv.CommandStats(call.command)
			check(err)
			for i := 0; i < wholeCalls; i++ {
				check(run(store.DecideCommand(policy, "client-"+strconv.Itoa(i%10_000), 1)))
			}
			calls1, usec1, err := srv.CommandStats(call.command)
			check(err)
			best = min(best, float64(usec1-usec0)/float64(calls1-calls0))
		}
		fmt.Printf("%6.2f  %s: %s\n", best, strings.ToUpper(call.command), call.name)
	}
}

// wholeCalls is how many EVALSHAs measure one call's cost.
const wholeCalls = 20_000

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
