package core

import (
	"strconv"
	"time"

	"github.com/tollgate/tollgate/core/algo"
)

// Decision is a policy's verdict on one request, with what rate-limit headers
// need. The summary fields come from the limit that decided: when denied, the
// denying limit with the longest RetryAfter; when allowed, the limit with the
// least Remaining (ties go to the longer window).
type Decision struct {
	// Allowed reports whether the request may proceed. In shadow mode it is
	// always true; Shadowed then tells whether the limits would have denied.
	Allowed bool
	// Shadowed reports a request the limits denied but shadow mode let through.
	Shadowed bool
	// Policy is the deciding policy.
	Policy *Policy
	// Index is the position in Policy.Limits() of the deciding limit.
	Index int
	// Quota is the deciding limit's Count.
	Quota int64
	// Remaining is the deciding limit's Remaining units.
	Remaining int64
	// Reset is the time until the deciding limit's full quota returns.
	Reset time.Duration
	// RetryAfter, when denied, is the time until the request would be admitted.
	RetryAfter time.Duration
	// Delay is how long to hold an allowed request (shaping); the longest
	// delay any limit asks for.
	Delay time.Duration
	// Fallback reports a decision the store's failure policy made because the
	// shared store (Redis) failed or its breaker was open.
	Fallback bool
	// Cost is the units of cost the request asked for.
	Cost int64
	// At is when the store decided, in µs on the store's clock (for Redis,
	// the server's TIME).
	At int64
	// Results holds each limit's verdict; only the first N are set.
	Results [MaxLimits]algo.Result
	// N is how many entries of Results are set.
	N int
}

// reset readies d for p. Results past N are left as they are: nothing reads
// them, and a Decision is reused per request in the hot path.
func (d *Decision) reset(p *Policy, cost int64) {
	d.Policy, d.N, d.Cost, d.Fallback = p, len(p.limits), cost, false
}

// Start readies d for a request of cost units under p: a store that does not
// run StoreSide.Apply calls it, fills Results[:N] and calls Summarize.
func (d *Decision) Start(p *Policy, cost int64) { d.reset(p, cost) }

// Undecided fills d with a verdict no limit made: allowed or not, with no
// result (N is 0), so nothing reports a count, a reset or a retry-after it
// does not know. A store's failure policy uses it when the shared store
// cannot answer (on_error allow or deny); headers render nothing for it.
func (d *Decision) Undecided(p *Policy, cost int64, allowed bool) {
	*d = Decision{Policy: p, Cost: cost, Allowed: allowed}
}

// DecidingLimit returns the limit that decided, or nil if d is empty or
// undecided.
func (d *Decision) DecidingLimit() *algo.Limit {
	if d.Policy == nil || d.N == 0 {
		return nil
	}
	limits := d.Policy.Limits()
	if d.Index >= len(limits) {
		return nil
	}
	return &limits[d.Index]
}

// Summarize fills d's summary fields from Results[:N]; allowed is whether
// every limit allowed the request. Stores call it after filling Results.
func (d *Decision) Summarize(allowed bool) {
	if d.N == 1 && (allowed || d.Policy == nil || !d.Policy.shadow) {
		d.summarizeOne(&d.Results[0])
		return
	}
	d.Allowed, d.Shadowed, d.Delay = allowed, false, 0
	best := -1
	penalty := -1
	if d.Policy != nil {
		penalty = d.Policy.penalty
	}
	for i := 0; i < d.N; i++ {
		r := &d.Results[i]
		d.Delay = max(d.Delay, r.Delay)
		if allowed && i == penalty {
			continue // a penalty box decides only the requests it refuses
		}
		if best < 0 {
			if allowed || !r.Allowed {
				best = i
			}
			continue
		}
		b := &d.Results[best]
		if allowed {
			if r.Remaining < b.Remaining || r.Remaining == b.Remaining && d.window(i) > d.window(best) {
				best = i
			}
		} else if !r.Allowed && r.RetryAfter > b.RetryAfter {
			best = i
		}
	}
	if best < 0 {
		best = 0
	}
	r := &d.Results[best]
	d.Index, d.Quota, d.Remaining, d.Reset, d.RetryAfter = best, r.Quota, r.Remaining, r.Reset, r.RetryAfter
	if allowed {
		d.RetryAfter = 0
	}
	if !allowed {
		d.Delay = 0
		if d.Policy != nil && d.Policy.shadow {
			d.Allowed, d.Shadowed = true, true
		}
	}
}

// summarizeOne is Summarize for one limit outside shadow mode: its result r
// is the decision.
func (d *Decision) summarizeOne(r *algo.Result) {
	d.Allowed, d.Shadowed, d.Index = r.Allowed, false, 0
	d.Quota, d.Remaining, d.Reset = r.Quota, r.Remaining, r.Reset
	if r.Allowed {
		d.RetryAfter, d.Delay = 0, r.Delay
	} else {
		d.RetryAfter, d.Delay = r.RetryAfter, 0
	}
}

func (d *Decision) window(i int) time.Duration {
	if d.Policy == nil || i >= len(d.Policy.limits) {
		return 0
	}
	return d.Policy.limits[i].Window
}

// MoreRestrictive reports whether a response should show a's headers rather
// than b's when a request passed through both: a denial over a shadowed
// denial over an allowance over an undecided allowance (see Undecided), then
// the longer RetryAfter, then the fewer Remaining.
func MoreRestrictive(a, b *Decision) bool {
	if ra, rb := a.severity(), b.severity(); ra != rb {
		return ra > rb
	}
	if !a.Allowed || a.Shadowed {
		return a.RetryAfter > b.RetryAfter
	}
	return a.Remaining < b.Remaining
}

func (d *Decision) severity() int {
	switch {
	case !d.Allowed:
		return 2
	case d.Shadowed:
		return 1
	case d.N == 0:
		return -1
	}
	return 0
}

// The names of a decision's fields as gateways expose them (request
// placeholders, log fields), read with Decision.Fields.
const (
	// FieldPolicy is the name of the deciding policy.
	FieldPolicy = "policy"
	// FieldPlan is the plan whose limits decided, "" for a policy without
	// plans.
	FieldPlan = "plan"
	// FieldLimit is the deciding limit's rate ("600/1m"), "" when no limit
	// decided (the store's failure policy did).
	FieldLimit = "limit"
	// FieldRemaining is the units left in the deciding limit.
	FieldRemaining = "remaining"
	// FieldDenied is "true" for a denied request, else "false".
	FieldDenied = "denied"
	// FieldRetryAfter is the retry-after in whole seconds when denied, else 0.
	FieldRetryAfter = "retry_after"
	// FieldDelay is how long an allowed request is held before it is
	// served (a leaky_bucket shaper's delay), as a Go duration ("250ms",
	// "0s").
	FieldDelay = "delay"
	// FieldDecidedAt is when the store decided, in µs since the Unix epoch
	// on the store's clock (Redis's TIME for the Redis store).
	FieldDecidedAt = "decided_at"
	// FieldStore is "shared" when the store decided, or "fallback" when
	// Redis failed and the failure policy decided.
	FieldStore = "store"
)

// Fields is a snapshot of a decision's fields (see FieldPolicy and the names
// after it), small enough to
// keep for a request's lifetime (a gateway's placeholders may be read
// after the handler returns).
type Fields struct {
	policy    string
	plan      string
	limit     *algo.Limit
	remaining int64
	retry     int64
	delay     time.Duration
	at        int64
	denied    bool
	fallback  bool
}

// Fields returns the snapshot of d's fields.
func (d *Decision) Fields() *Fields {
	f := new(Fields)
	d.FieldsTo(f)
	return f
}

// FieldsTo writes the snapshot of d's fields into f, for a caller that
// keeps it in memory it already has.
func (d *Decision) FieldsTo(f *Fields) {
	*f = Fields{policy: d.Policy.Name(), plan: d.Policy.Plan(), limit: d.DecidingLimit(), remaining: d.Remaining,
		at: d.At, denied: !d.Allowed, fallback: d.Fallback, delay: d.Delay}
	if f.denied {
		f.retry = Seconds(d.RetryAfter)
	}
}

// Field returns the field named name, and false for an unknown name.
func (f *Fields) Field(name string) (any, bool) {
	switch name {
	case FieldPolicy:
		return f.policy, true
	case FieldPlan:
		return f.plan, true
	case FieldLimit:
		if f.limit != nil {
			return f.limit.Rate(), true
		}
		return "", true
	case FieldRemaining:
		return f.remaining, true
	case FieldDenied:
		return strconv.FormatBool(f.denied), true
	case FieldRetryAfter:
		return f.retry, true
	case FieldDecidedAt:
		return f.at, true
	case FieldDelay:
		return f.delay.String(), true
	case FieldStore:
		if f.fallback {
			return "fallback", true
		}
		return "shared", true
	}
	return nil, false
}

// Seconds rounds d up to whole seconds, never below 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
