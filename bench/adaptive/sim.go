package main

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
)

// capacity is the model upstreams' capacity C, in requests/s (-capacity).
var capacity = 400.0

// rateAlgorithm is the rate limit's algorithm (-algorithm): GCRA, whose
// spacing follows the factor at once, by default.
var rateAlgorithm = algo.GCRA

// workers is the queueing upstream's concurrency: C × service.
func workers() int { return int(capacity * service.Seconds()) }

// The model upstreams' other constants.
const (
	service = 100 * time.Millisecond // an answer's unloaded latency
	refusal = 80 * time.Millisecond  // how long the rate-capacity upstream takes to answer 503
	timeout = 5 * time.Second        // the gateway's upstream timeout: a later answer counts as failed
	// offeredTimes is the offered load, in multiples of C.
	offeredTimes = 3.0
	// bucket is the resolution of the recorded trace.
	bucket = 50 * time.Millisecond
)

// upstreamKind is how a model upstream meets more than its capacity.
type upstreamKind int

const (
	// rateCapacity serves C/s, spaced (a burst of 5 at most), and answers
	// the excess with 503 after refusal.
	rateCapacity upstreamKind = iota
	// rateWindow serves at most C requests in any second (a fresh second
	// takes a burst of C) and answers the excess with 503 after refusal:
	// what it refused depends on the second before, a memory the
	// controller must not mistake for the present.
	rateWindow
	// queueing never refuses: requests wait for one of workers, so latency
	// grows with the work in flight.
	queueing
)

// scenario is a model upstream and the load offered to it over time.
type scenario struct {
	name     string
	limit    limitKind
	upstream upstreamKind
	length   time.Duration
	// changes are when capacity or load change (0 first); each phase is
	// judged from 3 s after its change.
	changes []time.Duration
	// capacityAt and offeredAt are in requests/s.
	capacityAt, offeredAt func(t time.Duration) float64
	// recovery: the load stops at the last change; measure the time until
	// the configured limit is back.
	recovery bool
	// pauses are when the gateway itself stalls for pauseLength: its
	// process stopped, the upstream not. Requests arriving meanwhile reach
	// it at the end, answers are heard then, and the controller is told of
	// the stall as the process's stall watch tells it.
	pauses []time.Duration
	// critical is the share of arrivals of priority 1; reserve is the share
	// of the limit the policy holds back for them (0: none).
	critical, reserve float64
	// nodes is how many gateway nodes share the limit and the adaptive
	// state, as a Redis store shares them (0: one node, alone). Each
	// arrival goes to one of them at random; each ends its intervals on
	// the common clock, sends its signals to the shared state, and reads
	// the shared factor half an interval later, each a little late (see
	// fleetLateness).
	nodes int
}

// fleetLateness is the most a fleet node's interval end or read comes late
// (uniformly from 0), as a loaded gateway's timers do.
const fleetLateness = 10 * time.Millisecond

// sharedState is a fleet's adaptive state, kept where every node reaches
// it (Redis, in a gateway): each node's signals and reads apply the rule's
// Go twin to it at the simulation's time, as the Redis store's FactorSync
// applies the Lua twin on the server's clock.
type sharedState struct {
	now      int64 // µs
	gradient adaptive.GradientState
	aimd     adaptive.AIMDState
}

// SyncFactor applies one node's signals (or, for AIMD, its verdict) to the
// shared state at the simulation's time and returns the shared factor.
func (f *sharedState) SyncFactor(_ context.Context, sig adaptive.Signals, congested bool, o adaptive.Options) (float64, error) {
	if o.Controller == adaptive.ControllerAIMD {
		f.aimd = adaptive.AIMD(f.aimd, f.now, congested, o)
		return f.aimd.Factor, nil
	}
	f.gradient = adaptive.Gradient(f.gradient, f.now, sig, o)
	return f.gradient.Factor, nil
}

// pauseLength is how long a gateway pause lasts.
const pauseLength = 300 * time.Millisecond

func constant(v float64) func(time.Duration) float64 { return func(time.Duration) float64 { return v } }

// scenarios are the benchmark's: each limit against each upstream it is
// made for. An in-flight limit meets the queueing upstream (whose capacity
// is a concurrency); in front of an upstream that refuses its excess fast
// (503 in 20ms, answers in 100ms) each slot above C × latency turns into 50
// refusals a second, which is what a rate limit is for.
func scenarios() []scenario {
	step := func(t time.Duration) float64 {
		if t >= 10*time.Second && t < 20*time.Second {
			return capacity / 2
		}
		return capacity
	}
	stopAt10 := func(t time.Duration) float64 {
		if t < 10*time.Second {
			return offeredTimes * capacity
		}
		return 0
	}
	var out []scenario
	for _, k := range []limitKind{rateLimit, inFlightLimit} {
		kinds := []upstreamKind{rateCapacity, rateWindow, queueing}
		if k == inFlightLimit {
			kinds = []upstreamKind{queueing}
		}
		for _, u := range kinds {
			out = append(out, scenario{name: map[upstreamKind]string{rateCapacity: "rate-capacity", rateWindow: "rate-window", queueing: "queueing"}[u], limit: k, upstream: u,
				length: 20 * time.Second, changes: []time.Duration{0}, capacityAt: constant(capacity), offeredAt: constant(offeredTimes * capacity)})
		}
		u := kinds[0]
		out = append(out,
			scenario{name: "capacity-step", limit: k, upstream: u, length: 30 * time.Second, changes: []time.Duration{0, 10 * time.Second, 20 * time.Second},
				capacityAt: step, offeredAt: constant(offeredTimes * capacity)},
			scenario{name: "recovery", limit: k, upstream: u, length: 40 * time.Second, changes: []time.Duration{0, 10 * time.Second}, recovery: true,
				capacityAt: constant(capacity), offeredAt: stopAt10})
	}
	// The gateway pauses three times in front of an upstream with capacity
	// to spare (a quarter of C offered, the limit at 4C): nothing is
	// congested, so the factor must stay at 1, or near it.
	out = append(out, scenario{name: "gateway-pause", limit: rateLimit, upstream: queueing, length: 20 * time.Second,
		changes: []time.Duration{0}, capacityAt: constant(capacity), offeredAt: constant(capacity / 4),
		pauses: []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second}})
	// The same pauses in front of two nodes on one machine: both stall at
	// once, and each tells the shared state so with its signals.
	out = append(out, scenario{name: "fleet-pause", limit: rateLimit, upstream: queueing, length: 20 * time.Second,
		changes: []time.Duration{0}, capacityAt: constant(capacity), offeredAt: constant(capacity / 4),
		pauses: []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second}, nodes: 2})
	// Two and three nodes share the limit and the adaptive state in front
	// of the rate-capacity upstream: each hears of the fleet's excess only
	// through the shared state, a judgement late.
	for _, n := range []int{2, 3} {
		out = append(out, scenario{name: fmt.Sprintf("fleet-%d", n), limit: rateLimit, upstream: rateCapacity, length: 20 * time.Second,
			changes: []time.Duration{0}, capacityAt: constant(capacity), offeredAt: constant(offeredTimes * capacity), nodes: n})
	}
	// A fifth of the 3C offered is critical (priority 1): with a reserve of
	// a fifth of the limit for it, and without one. The rest is shed.
	for _, reserve := range []float64{0.2, 0} {
		name := map[bool]string{true: "priority-reserve", false: "priority-none"}[reserve > 0]
		out = append(out, scenario{name: name, limit: rateLimit, upstream: rateCapacity, length: 20 * time.Second,
			changes: []time.Duration{0}, capacityAt: constant(capacity), offeredAt: constant(offeredTimes * capacity),
			critical: 0.2, reserve: reserve})
	}
	return out
}

// limitKind is what the adaptive policy limits.
type limitKind string

const (
	rateLimit     limitKind = "rate"      // 4C/1s GCRA, burst C/5 (or -algorithm)
	inFlightLimit limitKind = "in_flight" // 4 × workers in flight
)

// policy returns the adaptive policy of kind k, configured at 4× what the
// upstream can take (4C a second, or 4 × workers in flight), composed with
// a reserve of that share for priority 1 (0: none).
func policy(k limitKind, a *adaptive.Controller, reserve float64) *core.Family {
	l := algo.Limit{Count: int64(4 * capacity), Window: time.Second, Algorithm: rateAlgorithm}
	if rateAlgorithm == algo.GCRA || rateAlgorithm == algo.TokenBucket {
		l.Burst = int64(capacity / 5)
	}
	if k == inFlightLimit {
		l = algo.Limit{Count: 4 * int64(workers()), Window: time.Minute, Algorithm: algo.InFlight}
	}
	var r *core.Reserve
	if reserve != 0 {
		r = &core.Reserve{Share: reserve, Level: 1}
	}
	f, err := core.NewFamily(core.MustPolicy("upstream", core.PolicyOptions{Adaptive: a}, l), r)
	if err != nil {
		panic(err)
	}
	return f
}

// sample is one trace bucket.
type sample struct {
	offered, admitted, served, failed int
	capacity, factor                  float64
	// slowest is the slowest successful answer's latency; slow counts the
	// successful answers slower than twice the unloaded latency.
	slowest time.Duration
	slow    int
	// critOffered and critServed count the critical requests (priority 1)
	// offered and served.
	critOffered, critServed int
}

// run is one scenario through one controller and limit.
type run struct {
	scenario scenario
	limit    limitKind
	options  adaptive.Options
	trace    []sample
	// latencies are the successful answers' latencies, per phase, from 3 s
	// after the phase began.
	latencies [][]time.Duration
	// factorBack is when the factor was back at 1 after the load stopped
	// (recovery), or -1.
	factorBack time.Duration
}

// event kinds
const (
	arrive = iota
	answer
	judge
	// observe is an answer the gateway hears late (it was paused); resume
	// is the end of a pause.
	observe
	resume
	// read is a fleet node's read of the shared factor.
	read
)

type event struct {
	at   int64 // µs
	kind int
	req  *request
	seq  int64
	// due is when a judge event was scheduled (a pause may defer it);
	// held marks an arrival the gateway took in late, after a pause.
	due  int64
	held bool
	// node is the fleet node a judge or read event is for.
	node int
}

type request struct {
	start, sent int64 // µs: when it reached the upstream, and the gateway
	status      int
	d           core.Decision
	critical    bool
	node        int // the fleet node that let it through
}

type events []*event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(*event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// simulate runs scn through an adaptive policy of kind k with options o on
// a virtual clock, from seed: Poisson arrivals at the offered rate, the
// model upstream, the controller judging every o.Interval.
func simulate(scn scenario, o adaptive.Options, seed uint64) run {
	k := scn.limit
	o.Paced = k == rateLimit // as core/config sets it
	// One controller and policy per node; the nodes' policies share one
	// limit's state, as one Redis key, and their controllers one adaptive
	// state.
	nodes := max(1, scn.nodes)
	ctrls := make([]*adaptive.Controller, nodes)
	policies := make([]*core.Family, nodes)
	var shared *sharedState
	if nodes > 1 {
		shared = &sharedState{}
	}
	for i := range ctrls {
		c, err := adaptive.NewJudged(o)
		if err != nil {
			panic(err)
		}
		if shared != nil {
			c.SetSync(shared)
		}
		ctrls[i], policies[i] = c, policy(k, c, scn.reserve)
	}
	a := ctrls[0] // the one node, or the one whose factor is traced
	o = a.Options()
	states := make([]algo.State, 1)
	rng := rand.New(rand.NewPCG(seed, 1))
	// The fleet's own draws (which node, how late) come from a second
	// stream, so a single node's arrivals are the same as ever.
	fleetRng := rand.New(rand.NewPCG(seed, 2))
	late := func() int64 {
		if nodes == 1 {
			return 0
		}
		return fleetRng.Int64N(fleetLateness.Microseconds())
	}
	r := run{scenario: scn, limit: k, options: o, factorBack: -1,
		trace: make([]sample, int(scn.length/bucket)), latencies: make([][]time.Duration, len(scn.changes))}
	var q events
	var seq int64
	push := func(at int64, kind int, req *request) *event {
		seq++
		e := &event{at: at, kind: kind, req: req, seq: seq, due: at}
		heap.Push(&q, e)
		return e
	}
	// pausedUntil returns the end of the pause holding t (µs), or -1.
	pausedUntil := func(t int64) int64 {
		for _, from := range scn.pauses {
			if t >= from.Microseconds() && t < (from+pauseLength).Microseconds() {
				return (from + pauseLength).Microseconds()
			}
		}
		return -1
	}
	for _, from := range scn.pauses {
		push((from + pauseLength).Microseconds(), resume, nil) // first of its µs
	}
	end := scn.length.Microseconds()
	const t0 = int64(1_000_000_000) // the policy's clock: any positive start
	at := func(t int64) time.Duration { return time.Duration(t) * time.Microsecond }
	nextArrival := func(now int64) int64 {
		// Thinning keeps the process Poisson while the offered rate changes.
		maxRate := offeredTimes * capacity
		for {
			now += int64(rng.ExpFloat64() / maxRate * 1e6)
			if now >= end || rng.Float64()*maxRate < scn.offeredAt(at(now)) {
				return now
			}
		}
	}
	push(nextArrival(0), arrive, nil)
	for i := range nodes {
		e := push(o.Interval.Microseconds()+late(), judge, nil)
		e.node, e.due = i, o.Interval.Microseconds()
		if shared != nil {
			e := push(o.Interval.Microseconds()*3/2+late(), read, nil)
			e.node, e.due = i, o.Interval.Microseconds()*3/2
		}
	}
	// the rate-capacity upstream's theoretical arrival time (GCRA), and
	// the rate-window upstream's successes in the last second, in µs
	var tat int64
	var recent []int64
	// the queueing upstream: busy workers and requests waiting
	busy := 0
	var waiting []*request
	queueWorkers := func(now int64) int { return int(scn.capacityAt(at(now)) * service.Seconds()) }
	startService := func(req *request, now int64) {
		busy++
		req.start = now
		req.status = 200
		push(now+service.Microseconds(), answer, req)
	}
	phaseOf := func(t int64) int {
		i := 0
		for i+1 < len(scn.changes) && at(t) >= scn.changes[i+1] {
			i++
		}
		return i
	}
	heard := func(req *request, now int64, b *sample) {
		took := time.Duration(now-req.sent) * time.Microsecond
		status := req.status
		if took > timeout {
			status = 504
		}
		ctrls[req.node].Observe(status, took)
		if k == inFlightLimit {
			policies[req.node].Policy().StoreSide().ApplyLease(states, t0+now, req.d.At, 1, false)
		}
		if status == 200 {
			b.served++
			if req.critical {
				b.critServed++
			}
			b.slowest = max(b.slowest, took)
			if took > 2*service {
				b.slow++
			}
			ph := phaseOf(now)
			if at(now) >= scn.changes[ph]+3*time.Second {
				r.latencies[ph] = append(r.latencies[ph], took)
			}
		} else {
			b.failed++
		}
	}
	for q.Len() > 0 {
		e := heap.Pop(&q).(*event)
		now := e.at
		if now >= end {
			break
		}
		b := &r.trace[now/bucket.Microseconds()]
		until := pausedUntil(now)
		switch e.kind {
		case arrive:
			if !e.held {
				push(nextArrival(now), arrive, nil)
			}
			if until >= 0 {
				push(until, arrive, nil).held = true
				continue
			}
			b.offered++
			req := &request{sent: now, critical: scn.critical > 0 && rng.Float64() < scn.critical}
			if nodes > 1 {
				req.node = fleetRng.IntN(nodes)
			}
			a, p := ctrls[req.node], policies[req.node]
			priority := 0
			if req.critical {
				b.critOffered++
				priority = 1
			}
			chosen, _ := p.For("", priority)
			chosen.StoreSide().Apply(states, t0+now, 1, &req.d)
			if !req.d.Allowed {
				a.Deny() // as the gate does
				continue
			}
			a.Start()
			b.admitted++
			// answerAfter: served (200 after service) or refused (503 after
			// refusal).
			answerAfter := func(served bool) {
				req.start, req.status = now, 200
				after := service
				if !served {
					req.status, after = 503, refusal
				}
				push(now+after.Microseconds(), answer, req)
			}
			switch scn.upstream {
			case rateCapacity:
				interval := int64(1e6 / scn.capacityAt(at(now)))
				tat = max(tat, now)
				served := tat-now <= 5*interval
				if served {
					tat += interval
				}
				answerAfter(served)
			case rateWindow:
				// at most C successes in any second
				for len(recent) > 0 && recent[0] <= now-1_000_000 {
					recent = recent[1:]
				}
				served := len(recent) < int(scn.capacityAt(at(now)))
				if served {
					recent = append(recent, now)
				}
				answerAfter(served)
			case queueing:
				if busy < queueWorkers(now) {
					startService(req, now)
				} else {
					waiting = append(waiting, req)
				}
			}
		case answer:
			// The upstream answers whether or not the gateway is paused; a
			// paused gateway hears the answer when it resumes.
			req := e.req
			if scn.upstream == queueing {
				busy--
				if len(waiting) > 0 && busy < queueWorkers(now) {
					next := waiting[0]
					waiting = waiting[1:]
					startService(next, now)
				}
			}
			if until >= 0 {
				push(until, observe, req)
				continue
			}
			heard(req, now, b)
		case observe:
			heard(e.req, now, b)
		case resume:
			for _, c := range ctrls {
				c.NoteStall(pauseLength)
			}
		case judge, read:
			if until >= 0 {
				held := push(until, e.kind, nil)
				held.due, held.node = e.due, e.node
				continue
			}
			if shared != nil {
				shared.now = t0 + now
			}
			if c := ctrls[e.node]; e.kind == judge {
				c.Judge()
			} else {
				c.ReadShared()
			}
			if e.node == 0 {
				b.factor = a.Factor()
			}
			next := push(e.due+o.Interval.Microseconds()+late(), e.kind, nil)
			next.due, next.node = e.due+o.Interval.Microseconds(), e.node
			if e.kind == read {
				continue
			}
			if scn.recovery && r.factorBack < 0 && at(now) >= scn.changes[len(scn.changes)-1] && a.Factor() == 1 {
				r.factorBack = at(now) - scn.changes[len(scn.changes)-1]
			}
		}
	}
	f := 1.0
	for i := range r.trace {
		r.trace[i].capacity = scn.capacityAt(time.Duration(i) * bucket)
		// the factor in force at the bucket's end: carried between judgements
		if r.trace[i].factor == 0 {
			r.trace[i].factor = f
		}
		f = r.trace[i].factor
	}
	return r
}

// figures are one run's results against the targets.
type figures struct {
	// goodput is the successful answers a second over each phase's judged
	// part, as a share of the capacity then (or of the load offered, if
	// less).
	goodput float64
	// failing is the share of the upstream's answers that failed in the
	// same parts.
	failing float64
	// p99 is the 99th percentile latency of successful answers over the
	// judged parts, in multiples of the unloaded latency.
	p99 float64
	// settle is the longest time, over the changes, from a change until
	// the moment from which the next 2 s (or the rest of the phase) meet
	// the targets: the upstream served at least 0.9 of its capacity, at
	// most 5% failed and at most 1% of its answers took more than twice
	// the unloaded latency (recovery: the load stops, so only the first
	// change counts).
	settle time.Duration
	// recovery is the time from the load stopping until the configured
	// limit was back (recovery only; -1 never).
	recovery time.Duration
	// lowest is the lowest factor from the first gateway pause on.
	lowest float64
	// critical is the share of critical requests served over the judged
	// parts (priority scenarios).
	critical float64
	// worst4s is the most failing of the 4 s spans a fleet test judges
	// (the last 4 s of 10 s of load; see caddymodule's fleet tests): from
	// 6 s after a change, every 4 s within its phase.
	worst4s float64
}

func (r run) figures() figures {
	var f figures
	per := int(time.Second / bucket)
	var served, failed, owed, critOffered, critServed float64
	var lat []time.Duration
	for ph, from := range r.scenario.changes {
		to := r.scenario.length
		if ph+1 < len(r.scenario.changes) {
			to = r.scenario.changes[ph+1]
		}
		if r.scenario.recovery && ph == len(r.scenario.changes)-1 {
			continue // no load: nothing to serve
		}
		for i := int((from + 3*time.Second) / bucket); i < int(to/bucket); i++ {
			s := r.trace[i]
			served += float64(s.served)
			failed += float64(s.failed)
			critOffered += float64(s.critOffered)
			critServed += float64(s.critServed)
			owed += min(s.capacity, r.scenario.offeredAt(time.Duration(i)*bucket)) / float64(per)
		}
		lat = append(lat, r.latencies[ph]...)
		// settle: the first moment from which the next 2 s (or the rest of
		// the phase) meet the targets: served ≥ 0.9 C, ≤ 5% failing, ≤ 1%
		// of answers slower than twice the unloaded latency
		settled := to - from
		w := int(2 * time.Second / bucket)
		for i := int(from / bucket); i < int(to/bucket); i++ {
			var sv, fl, cap, slow float64
			for _, s := range r.trace[i:min(i+w, int(to/bucket))] {
				sv += float64(s.served)
				fl += float64(s.failed)
				cap += min(s.capacity, r.scenario.offeredAt(time.Duration(i)*bucket)) / float64(per)
				slow += float64(s.slow)
			}
			if sv >= 0.9*cap && fl <= 0.05*(sv+fl) && slow <= 0.01*sv {
				settled = time.Duration(i)*bucket - from
				break
			}
		}
		f.settle = max(f.settle, settled)
		for w := from + 6*time.Second; w+4*time.Second <= to; w += 4 * time.Second {
			var sv, fl float64
			for _, s := range r.trace[int(w/bucket):int((w+4*time.Second)/bucket)] {
				sv += float64(s.served)
				fl += float64(s.failed)
			}
			if sv+fl > 0 {
				f.worst4s = max(f.worst4s, fl/(sv+fl))
			}
		}
	}
	f.goodput = served / owed
	if critOffered > 0 {
		f.critical = critServed / critOffered
	}
	if served+failed > 0 {
		f.failing = failed / (served + failed)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		f.p99 = float64(lat[int(math.Ceil(0.99*float64(len(lat))))-1]) / float64(service)
	}
	f.recovery = r.factorBack
	f.lowest = 1
	if len(r.scenario.pauses) > 0 {
		for _, s := range r.trace[int(r.scenario.pauses[0]/bucket):] {
			f.lowest = min(f.lowest, s.factor)
		}
	}
	return f
}
