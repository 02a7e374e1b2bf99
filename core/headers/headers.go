package headers

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/internal/enum"
)

// Style selects which rate-limit headers a decision renders.
type Style uint8

// The header styles. Retry-After is sent on denial with every style but None.
const (
	// Both sends the IETF and the X-RateLimit fields (the default).
	Both Style = iota
	// IETF sends the fields of draft-ietf-httpapi-ratelimit-headers-10/-11:
	// RateLimit-Policy: "name";q=<count>;w=<window s> (one item per limit) and
	// RateLimit: "name";r=<remaining>;t=<reset s> for the deciding limit.
	IETF
	// XRateLimit sends X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the quota resets) for the deciding limit.
	XRateLimit
	// None sends no rate-limit header at all, not even Retry-After.
	None
	// PerLimit sends a limit and remaining field for each limit, as
	// API gateways' own rate limiters commonly do:
	// X-RateLimit-Limit-<Name> and X-RateLimit-Remaining-<Name> for every
	// limit (Name is the limit's label with its first letter upper-cased, so
	// a limit named "minute" gives X-RateLimit-Limit-Minute), then
	// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (whole
	// seconds, at least 1) for the deciding limit, and on denial
	// Retry-After: when a retry can pass (for a fixed window that reset).
	// A limit's figure is its capacity: the count, or a bucket's burst.
	PerLimit
	// AI sends a token budget's fields as AI gateways name them, each
	// limit named by its window in whole seconds and its Name (the
	// provider or model it budgets; left out when empty):
	// X-AI-RateLimit-Limit-<window>-<Name> and
	// X-AI-RateLimit-Remaining-<window>-<Name> for every limit, then
	// X-AI-RateLimit-Reset (whole seconds until the deciding limit's quota
	// returns), and on denial X-AI-RateLimit-Retry-After,
	// X-AI-RateLimit-Retry-After-<window>-<Name> and
	// X-AI-RateLimit-Reset-<window>-<Name> of the deciding limit, and
	// Retry-After (seconds until a retry can pass).
	AI
)

var headerStyleNames = []string{Both: "both", IETF: "ietf", XRateLimit: "xratelimit", None: "none", PerLimit: "per_limit", AI: "ai"}

// String returns the configuration name of s.
func (s Style) String() string { return enum.Name(headerStyleNames, s, "Style") }

// ParseStyle reads "ietf", "xratelimit", "both", "none", "per_limit", or
// one of names: the adapter's own names for styles, as its users know them
// (nil for none).
func ParseStyle(s string, names map[string]Style) (Style, error) {
	if style, ok := enum.Parse[Style](headerStyleNames, s); ok {
		return style, nil
	}
	if style, ok := names[s]; ok {
		return style, nil
	}
	all := []string{"ietf", "xratelimit", "both", "none", "per_limit", "ai"}
	all = append(all, slices.Sorted(maps.Keys(names))...)
	return 0, fmt.Errorf("headers: unknown style %q (want %s or %s)", s, strings.Join(all[:len(all)-1], ", "), all[len(all)-1])
}

// Options configures header rendering.
type Options struct {
	// Style picks the fields.
	Style Style
	// Jitter adds up to this fraction of Retry-After, at random, so denied
	// clients do not all come back at the same second; 0 to 1.
	Jitter float64
	// Rand returns a number in [0,1) for the jitter; nil uses math/rand/v2.
	Rand func() float64
}

// Header names, in the canonical form net/http stores them.
const (
	RateLimitPolicy = "Ratelimit-Policy"
	RateLimit       = "Ratelimit"
	XLimit          = "X-Ratelimit-Limit"
	XRemaining      = "X-Ratelimit-Remaining"
	XReset          = "X-Ratelimit-Reset"
	RetryAfter      = "Retry-After"
	// The deciding limit's fields of PerLimit, in that style's
	// casing (RateLimit-, not net/http's Ratelimit-).
	PerLimitLimit     = "RateLimit-Limit"
	PerLimitRemaining = "RateLimit-Remaining"
	PerLimitReset     = "RateLimit-Reset"
	// The AI style's fields that name no limit.
	AIReset      = "X-AI-RateLimit-Reset"
	AIRetryAfter = "X-AI-RateLimit-Retry-After"
)

// RetryAfterSeconds returns the Retry-After value for d: RetryAfter in whole
// seconds rounded up (at least 1), plus the jitter.
func (o Options) RetryAfterSeconds(d *core.Decision) int64 {
	secs := max(1, core.Seconds(d.RetryAfter))
	if o.Jitter > 0 {
		r := o.Rand
		if r == nil {
			r = rand.Float64
		}
		secs += int64(math.Ceil(r() * min(o.Jitter, 1) * float64(secs)))
	}
	return secs
}

// Render calls set for every header d carries under o. Retry-After is
// set only for a request that is denied (not for shadowed ones).
// Each decision's policy fields are derived anew: a Renderer keeps them.
func Render(d *core.Decision, o Options, setHeader func(name, value string)) {
	var v headerValues
	v.render(d, o, nil)
	v.each(setHeader)
}

// Renderer renders the decisions of a known set of policies under one
// Options, each policy's header fields (names, quotas, the
// RateLimit-Policy field) derived once and again only when an adaptive
// factor moves its limits, not per request. It is safe for concurrent
// use.
type Renderer struct {
	o     Options
	cache map[*core.Policy]*atomic.Pointer[policyFields] // read-only after NewRenderer
}

// NewRenderer returns a Renderer of o that keeps the fields of policies
// (every policy a decision it renders may name: each plan's, and their
// variants); a decision of another policy renders too, its fields derived
// for it alone.
func NewRenderer(o Options, policies ...*core.Policy) *Renderer {
	r := &Renderer{o: o, cache: make(map[*core.Policy]*atomic.Pointer[policyFields], len(policies))}
	for _, p := range policies {
		if p != nil {
			r.cache[p] = new(atomic.Pointer[policyFields])
		}
	}
	return r
}

// Options returns the options r renders with.
func (r *Renderer) Options() Options { return r.o }

// Render calls set for every header d carries (see the package's Render).
func (r *Renderer) Render(d *core.Decision, setHeader func(name, value string)) {
	var v headerValues
	v.render(d, r.o, r.cache)
	v.each(setHeader)
}

// Write sets d's headers on h (see the package's Write).
func (r *Renderer) Write(h http.Header, d *core.Decision) { write(h, d, r.o, r.cache) }

// headerValues are the headers of one decision: the numbers are written
// into one buffer that becomes a single string, so rendering a decision's
// headers allocates once, not once per value.
type headerValues struct {
	n     int
	names [maxHeaders]string
	fixed [maxHeaders]string // a value that needs no formatting, or ""
	ends  [maxHeaders]int    // else the end of its bytes in the buffer
	used  int                // bytes of space written
	space [160]byte          // the buffer; enough for all but long names
	spill []byte             // the buffer once space is full
}

// spillOver moves the buffer to the heap, where a long name fits.
func (v *headerValues) spillOver() {
	if v.spill == nil {
		v.spill = append(make([]byte, 0, 2*len(v.space)), v.space[:v.used]...)
	}
}

func (v *headerValues) writeString(s string) {
	if v.spill == nil && v.used+len(s) <= len(v.space) {
		v.used += copy(v.space[v.used:], s)
		return
	}
	v.spillOver()
	v.spill = append(v.spill, s...)
	v.used = len(v.spill)
}

func (v *headerValues) writeInt(i int64) {
	if v.spill == nil && v.used+20 <= len(v.space) { // 20: the longest int64
		v.used += len(strconv.AppendInt(v.space[v.used:v.used], i, 10))
		return
	}
	v.spillOver()
	v.spill = strconv.AppendInt(v.spill, i, 10)
	v.used = len(v.spill)
}

// add starts a value whose bytes are written next, up to end.
func (v *headerValues) add(name string) { v.names[v.n], v.fixed[v.n] = name, ""; v.n++ }

// end closes the value added last.
func (v *headerValues) end() { v.ends[v.n-1] = v.used }

// addFixed adds a value that is already a string.
func (v *headerValues) addFixed(name, value string) {
	v.names[v.n], v.fixed[v.n], v.ends[v.n] = name, value, v.used
	v.n++
}

// addInt adds a value that is one number.
func (v *headerValues) addInt(name string, i int64) {
	v.add(name)
	v.writeInt(i)
	v.end()
}

// each calls set for every header, in order.
func (v *headerValues) each(set func(name, value string)) {
	var all string
	if v.spill != nil {
		all = string(v.spill)
	} else {
		all = string(v.space[:v.used])
	}
	start := 0
	for i := 0; i < v.n; i++ {
		value := v.fixed[i]
		if value == "" {
			value = all[start:v.ends[i]]
		}
		start = v.ends[i]
		set(v.names[i], value)
	}
}

// render fills v with d's headers under o, its policy's fields from
// cache when it holds them.
func (v *headerValues) render(d *core.Decision, o Options, cache map[*core.Policy]*atomic.Pointer[policyFields]) {
	v.n, v.used, v.spill = 0, 0, nil
	if o.Style == None || d.Policy == nil || d.N == 0 {
		return
	}
	if o.Style == PerLimit {
		v.renderPerLimit(d, o, cache)
		return
	}
	if o.Style == AI {
		v.renderAI(d, o, cache)
		return
	}
	// t (and X-RateLimit-Reset): when the quota returns; on a denial, when
	// this request would be admitted, so Retry-After is never before it.
	reset := core.Seconds(d.Reset)
	if !d.Allowed {
		reset = max(1, core.Seconds(d.RetryAfter))
	}
	if o.Style == Both || o.Style == IETF {
		f := fieldsOf(d.Policy, cache)
		policy, units := f.policy, ""
		if d.Cost > 1 {
			// Each request takes Cost units: q and r count units, not requests.
			policy, units = f.policyUnits, `;qu="units"`
		}
		if f.limits[d.Index].Algorithm == algo.InFlight {
			units = `;qu="concurrent-requests"` // as its policy item says
		}
		v.addFixed(RateLimitPolicy, policy)
		v.add(RateLimit)
		v.writeString(f.names[d.Index])
		v.writeString(";r=")
		v.writeInt(max(0, d.Remaining))
		v.writeString(";t=")
		v.writeInt(reset)
		v.writeString(units)
		v.end()
	}
	if o.Style == Both || o.Style == XRateLimit {
		v.addFixed(XLimit, fieldsOf(d.Policy, cache).quotas[d.Index])
		v.addInt(XRemaining, max(0, d.Remaining))
		v.addInt(XReset, reset)
	}
	if !d.Allowed {
		v.addInt(RetryAfter, o.RetryAfterSeconds(d))
	}
}

// Write sets d's headers (see Render) on h.
func Write(h http.Header, d *core.Decision, o Options) { write(h, d, o, nil) }

func write(h http.Header, d *core.Decision, o Options, cache map[*core.Policy]*atomic.Pointer[policyFields]) {
	var v headerValues
	v.render(d, o, cache)
	if v.n == 0 {
		return
	}
	// Every value shares one backing array: one allocation, not one per
	// header.
	backing := make([]string, v.n)
	i := 0
	v.each(func(name, value string) {
		backing[i] = value
		if o.Style == PerLimit || o.Style == AI {
			name = http.CanonicalHeaderKey(name) // the style's casing is not net/http's
		}
		h[name] = backing[i : i+1 : i+1]
		i++
	})
}

// renderPerLimit adds the per-limit header set for d (see PerLimit).
func (v *headerValues) renderPerLimit(d *core.Decision, o Options, cache map[*core.Policy]*atomic.Pointer[policyFields]) {
	f := fieldsOf(d.Policy, cache)
	for i := 0; i < d.N; i++ {
		v.addFixed(f.perLimit[2*i], f.quotas[i])
		v.addInt(f.perLimit[2*i+1], max(0, d.Results[i].Remaining))
	}
	// On a denial, the reset is when this request would pass, as the IETF
	// fields' t: for a fixed window that is its end.
	reset := max(1, core.Seconds(d.Reset))
	if !d.Allowed {
		reset = max(1, core.Seconds(d.RetryAfter))
	}
	v.addFixed(PerLimitLimit, f.quotas[d.Index])
	v.addInt(PerLimitRemaining, max(0, d.Remaining))
	v.addInt(PerLimitReset, reset)
	if !d.Allowed {
		// When a retry can pass: for a fixed window its end, the reset
		// (as gateways' own per-limit sets say); for a bucket the next token, not the
		// time to fill it.
		v.addInt(RetryAfter, o.RetryAfterSeconds(d))
	}
}

// renderAI adds the AI header set for d (see AI).
func (v *headerValues) renderAI(d *core.Decision, o Options, cache map[*core.Policy]*atomic.Pointer[policyFields]) {
	f := fieldsOf(d.Policy, cache)
	for i := 0; i < d.N; i++ {
		v.addFixed(f.ai[4*i], f.quotas[i])
		v.addInt(f.ai[4*i+1], max(0, d.Results[i].Remaining))
	}
	if d.Allowed {
		v.addInt(AIReset, max(1, core.Seconds(d.Reset)))
		return
	}
	// A denied request's reset is when it would pass, as PerLimit's.
	retry, reset := o.RetryAfterSeconds(d), max(1, core.Seconds(d.RetryAfter))
	v.addInt(AIReset, reset)
	v.addInt(AIRetryAfter, retry)
	v.addInt(f.ai[4*d.Index+2], retry)
	v.addInt(f.ai[4*d.Index+3], reset)
	v.addInt(RetryAfter, retry)
}

// quotaOf is what a limit's limit headers (X-RateLimit-Limit, the per-limit set's
// RateLimit-Limit and X-RateLimit-Limit-<Name>) say: the q of its
// RateLimit-Policy item (see ietfQuota; in_flight's slots), so every header
// of a response describes the same limit, and its remaining is never above
// it.
func quotaOf(l *algo.Limit) int64 {
	if l.Algorithm == algo.InFlight {
		return l.Count
	}
	q, _ := ietfQuota(l)
	return q
}

// policyFields is what the header sets derive from a policy's limits in
// force, kept by a Renderer: derived again only when the limits in force
// change (an adaptive factor moved).
type policyFields struct {
	limits []algo.Limit // in force, as they were derived from
	// names quotes each limit's name (limitItemNames); perLimit holds, per
	// limit, its limit and remaining header names (PerLimit); ai its
	// limit, remaining, retry-after and reset header names (AI).
	names, perLimit, ai []string
	// quotas are the limits' figures for the limit headers (quotaOf), in
	// decimal: the same on every request, so formatted once.
	quotas []string
	// The RateLimit-Policy field for requests of cost 1 (and 0), and for
	// costlier ones, whose quota is counted in units (see Render).
	policy, policyUnits string
}

// fieldsOf returns p's header fields for its limits in force: from
// cache, when it holds p's, else derived anew (and kept there).
func fieldsOf(p *core.Policy, cache map[*core.Policy]*atomic.Pointer[policyFields]) *policyFields {
	limits := p.Limits()
	slot := cache[p]
	if slot != nil {
		if f := slot.Load(); f != nil && &f.limits[0] == &limits[0] {
			return f
		}
	}
	f := &policyFields{limits: limits, names: limitItemNames(p.ShownName(), limits), perLimit: perLimitHeaderNames(limits), ai: aiHeaderNames(limits)}
	for i := range limits {
		f.quotas = append(f.quotas, strconv.FormatInt(quotaOf(&limits[i]), 10))
	}
	f.policy, f.policyUnits = ietfPolicyField(f.names, limits, false), ietfPolicyField(f.names, limits, true)
	if slot != nil {
		slot.Store(f) // concurrent derivations are equal; the last one stays
	}
	return f
}

// perLimitHeaderNames returns, per limit, its X-RateLimit-Limit-<Name> and
// X-RateLimit-Remaining-<Name> header names, in the style's casing.
func perLimitHeaderNames(limits []algo.Limit) []string {
	names := make([]string, 0, 2*len(limits))
	for _, l := range limits {
		suffix := l.Label()
		if c := suffix[0]; c >= 'a' && c <= 'z' {
			suffix = string(c-'a'+'A') + suffix[1:]
		}
		names = append(names, "X-RateLimit-Limit-"+suffix, "X-RateLimit-Remaining-"+suffix)
	}
	return names
}

// aiHeaderNames returns, per limit, its X-AI-RateLimit-Limit-,
// -Remaining-, -Retry-After- and -Reset-<window>-<Name> header names.
func aiHeaderNames(limits []algo.Limit) []string {
	names := make([]string, 0, 4*len(limits))
	for _, l := range limits {
		suffix := "-" + strconv.FormatInt(max(1, core.Seconds(l.Window)), 10)
		if l.Name != "" {
			suffix += "-" + l.Name
		}
		names = append(names, "X-AI-RateLimit-Limit"+suffix, "X-AI-RateLimit-Remaining"+suffix,
			"X-AI-RateLimit-Retry-After"+suffix, "X-AI-RateLimit-Reset"+suffix)
	}
	return names
}

// maxHeaders is the most headers Render sets: the AI set for MaxLimits
// limits, on a denial.
const maxHeaders = 2*core.MaxLimits + 5

// sfString renders s as a structured-field string (RFC 9651): printable
// ASCII in quotes, with quote and backslash escaped; other bytes become '_'.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// limitItemNames names each limit of a policy in the IETF fields: the limit's
// Name, else the policy's name (one limit) or the policy's name and the
// window ("api-1m"), numbered when two windows repeat.
func limitItemNames(policy string, limits []algo.Limit) []string {
	names := make([]string, len(limits))
	seen := map[string]bool{}
	for i, l := range limits {
		name := l.Name
		if name == "" {
			name = policy
			if len(limits) > 1 {
				name = policy + "-" + algo.FormatWindow(l.Window)
			}
		}
		if seen[name] {
			name += "-" + strconv.Itoa(i+1)
		}
		seen[name] = true
		names[i] = sfString(name)
	}
	return names
}

// ietfPolicyField renders RateLimit-Policy for limits, each item in its
// ietfQuota; units adds qu="units" to each (see Render).
func ietfPolicyField(names []string, limits []algo.Limit, units bool) string {
	var b strings.Builder
	for i := range limits {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(names[i])
		if limits[i].Algorithm == algo.InFlight {
			// Slots held at once, over no window: the draft's unit for it.
			b.WriteString(";q=" + strconv.FormatInt(limits[i].Count, 10) + `;qu="concurrent-requests"`)
			continue
		}
		q, w := ietfQuota(&limits[i])
		b.WriteString(";q=" + strconv.FormatInt(q, 10))
		b.WriteString(";w=" + strconv.FormatInt(w, 10))
		if units {
			b.WriteString(`;qu="units"`)
		}
	}
	return b.String()
}

// ietfQuota is how l is advertised in RateLimit-Policy: q units per w
// seconds, with the remaining r of the RateLimit field never above q. The
// counting algorithms advertise Count per Window; token bucket, GCRA and
// leaky bucket their burst (the most that can be used at once) per the time
// it takes to refill. Both are scaled by the smallest factor that makes w
// whole seconds, so q/w is the limit's exact rate ("10/500ms" is q=20;w=1);
// where that would take q past MaxCount, w is rounded up instead (a rate a
// little under the limit's).
func ietfQuota(l *algo.Limit) (q, w int64) {
	// The period, as the fraction num/den µs.
	q, num, den := l.Count, big.NewInt(l.WindowMicros()), big.NewInt(1)
	switch l.Algorithm {
	case algo.TokenBucket, algo.GCRA, algo.LeakyBucket:
		q, num, den = l.EffectiveBurst(), big.NewInt(l.EffectiveBurst()*l.WindowMicros()), big.NewInt(l.Count)
	}
	second := new(big.Int).Mul(den, big.NewInt(int64(time.Second/time.Microsecond)))
	k := new(big.Int).Div(second, new(big.Int).GCD(nil, nil, num, second))
	if k.IsInt64() && k.Int64() <= algo.MaxCount/q {
		return q * k.Int64(), new(big.Int).Div(new(big.Int).Mul(num, k), second).Int64()
	}
	w = new(big.Int).Div(new(big.Int).Add(num, new(big.Int).Sub(second, big.NewInt(1))), second).Int64()
	return q, max(1, w)
}
