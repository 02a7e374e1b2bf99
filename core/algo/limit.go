package algo

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// maxExact is 2^53: every integer a step function computes stays at or below
// it so that the Redis Lua scripts, whose numbers are doubles, compute exactly
// the same values as Go.
const maxExact = 1 << 53

// AboveMaxCount is the error of a count or burst above MaxCount, in the one
// wording every front door reports: field names it, written is its value
// as written (a gateway's config may write it as a fraction).
func AboveMaxCount(field, written string) error {
	return fmt.Errorf("%s: %s is above %d, the largest integer a RateLimit header can carry (RFC 9651)", field, written, int64(MaxCount))
}

// MaxCount is the largest Count or Burst: a Structured Field integer (RFC
// 9651, which the RateLimit headers use) has at most 15 digits.
const MaxCount = 999_999_999_999_999

// MaxSlidingLogCount bounds Count for SlidingLog, which stores one timestamp
// (8 bytes) per request held in the window.
const MaxSlidingLogCount = 1_000_000

// CalendarMonth and CalendarYear are windows that follow the calendar in
// UTC: a FixedWindow limit over one of them counts from the first of the
// month (or 1 January), 00:00 UTC, to the next, as gateways' month and
// year periods do. As durations they are the nominal 30 and 365 days, which headers
// advertise and the other algorithms count as plain windows; the extra
// nanosecond only tells them apart (every step counts in whole µs).
const (
	CalendarMonth = 30*24*time.Hour + 1
	CalendarYear  = 365*24*time.Hour + 1
)

// Limit is one rate: Count units of cost per Window, counted by Algorithm.
type Limit struct {
	// Name labels the limit in headers, metrics and decisions. Empty means the
	// limit's rate, such as "600/1m".
	Name string
	// Count is how many units of cost Window admits; at least 1.
	Count int64
	// Window is the period Count applies to; at least 1µs, counted in whole
	// µs; CalendarMonth or CalendarYear for calendar windows.
	Window time.Duration
	// Algorithm counts the requests; zero means DefaultAlgorithm.
	Algorithm Algorithm
	// Burst is the bucket size in units of cost: for TokenBucket the tokens a
	// full bucket holds (default Count); for GCRA how many units may arrive at
	// once (default 1); for LeakyBucket the queue size (default: as many as
	// MaxDelay holds). Other algorithms ignore it.
	Burst int64
	// MaxDelay is, for LeakyBucket, the longest a request may be delayed
	// (required, > 0); for InFlight, the longest a refused request may wait
	// for a slot (0: refuse at once). Other algorithms ignore it.
	MaxDelay time.Duration
	// AfterResponse charges the limit when the response is known instead
	// of when the request arrives: a request passes it while it has a unit
	// left, charging nothing (Check), and the cost the response reports is
	// charged after (Charge), which may overdraw it. Not for LeakyBucket,
	// which delays requests as they arrive, nor InFlight, which holds them.
	AfterResponse bool

	// Compiled by validate: window, max delay and emission bound in µs, and
	// the months of a calendar FixedWindow (1 or 12; 0 when epoch-aligned).
	windowUS   int64
	burst      int64
	maxDelayUS int64
	months     int64
	// reserved is, in a limit Unreserved made from a window or in-flight
	// limit, the units of the full limit's Count held back: the state the
	// two share holds up to Count+reserved units.
	reserved int64
}

// Unreserved returns l as requests below a reserve's priority see it, with
// share (between 0 and 1) of its quota held back for higher priorities:
// the window algorithms and InFlight admit a Count smaller by that share,
// TokenBucket, GCRA and LeakyBucket a burst smaller by it (their rate is
// the same). At least one unit stays unreserved. The two limits count in
// one state: the step functions keep the full limit's history. l must
// have been validated.
func (l Limit) Unreserved(share float64) Limit {
	held := func(n int64) int64 { return min(n-1, int64(math.Floor(float64(n)*share))) }
	switch l.Algorithm {
	case TokenBucket, GCRA, LeakyBucket:
		l.Burst = l.burst - held(l.burst)
	case Penalty:
	default:
		r := held(l.Count)
		l.Count, l.reserved = l.Count-r, l.reserved+r
	}
	if err := l.Normalize(); err != nil {
		panic("algo: a smaller limit than a valid one is invalid: " + err.Error())
	}
	return l
}

// WindowMicros returns l's window in µs (after Normalize).
func (l *Limit) WindowMicros() int64 { return l.windowUS }

// CalendarMonths returns how many calendar months a window of l spans: 1
// or 12 for a FixedWindow over CalendarMonth or CalendarYear, 0 for a
// window aligned to the Unix epoch. l must have been validated.
func (l *Limit) CalendarMonths() int64 { return l.months }

// Rate returns l's rate as "<count>/<window>", the form ParseRate reads.
func (l *Limit) Rate() string {
	return strconv.FormatInt(l.Count, 10) + "/" + FormatWindow(l.Window)
}

// Label returns l.Name, or l.Rate() when Name is empty.
func (l *Limit) Label() string {
	if l.Name != "" {
		return l.Name
	}
	return l.Rate()
}

// EffectiveBurst returns the burst the algorithm uses after defaults
// (see Limit.Burst). It is 0 for algorithms without a burst.
func (l *Limit) EffectiveBurst() int64 {
	if l.burst != 0 {
		return l.burst
	}
	c := *l
	if c.Normalize() != nil {
		return 0
	}
	return c.burst
}

// Validate reports whether l is usable, with an error naming the field and
// its value. A Policy validates its limits when it is built.
func (l Limit) Validate() error { return l.Normalize() }

// Normalize checks l as Validate does and fills in its defaults (algorithm,
// burst) and the fields derived from them (window in µs, calendar months),
// which the step functions read.
func (l *Limit) Normalize() error {
	if l.Algorithm == 0 {
		l.Algorithm = DefaultAlgorithm
	}
	if l.Algorithm > Penalty {
		return fmt.Errorf("algorithm: unknown value %d", l.Algorithm)
	}
	if l.Count < 1 {
		return fmt.Errorf("count: %d must be at least 1", l.Count)
	}
	if l.Count > MaxCount {
		return AboveMaxCount("count", strconv.FormatInt(l.Count, 10))
	}
	if l.Burst > MaxCount {
		return AboveMaxCount("burst", strconv.FormatInt(l.Burst, 10))
	}
	if l.Window < time.Microsecond {
		return fmt.Errorf("window: %s must be at least 1µs", l.Window)
	}
	l.windowUS = int64(l.Window / time.Microsecond)
	l.months = 0
	if l.Algorithm == FixedWindow {
		l.months = map[time.Duration]int64{CalendarMonth: 1, CalendarYear: 12}[l.Window]
	}
	if l.Burst < 0 {
		return fmt.Errorf("burst: %d must be at least 1", l.Burst)
	}
	if l.MaxDelay < 0 {
		return fmt.Errorf("max_delay: %s must not be negative", l.MaxDelay)
	}
	l.maxDelayUS = int64(l.MaxDelay / time.Microsecond)
	// An option the algorithm would ignore is a mistake in the config: it
	// would read as a limit it is not.
	switch {
	case l.Burst != 0 && !l.Algorithm.HasBurst():
		return fmt.Errorf("burst: %d means nothing to %s (token_bucket, gcra and leaky_bucket have a burst)", l.Burst, l.Algorithm)
	case l.MaxDelay != 0 && !l.Algorithm.HasMaxDelay():
		return fmt.Errorf("max_delay: %s means nothing to %s (leaky_bucket delays up to it, in_flight waits up to it for a slot)", FormatWindow(l.MaxDelay), l.Algorithm)
	}
	switch l.Algorithm {
	case FixedWindow, SlidingCounter:
		l.burst = 0
		if l.Count > maxExact/4 {
			return fmt.Errorf("count: %d is above %d", l.Count, int64(maxExact/4))
		}
	case Penalty:
		l.burst = 0
		if l.MaxDelay <= 0 {
			return fmt.Errorf("penalty: a box of %s must be above 0 (how long a key is refused)", l.MaxDelay)
		}
		if l.maxDelayUS > maxExact/8 {
			return fmt.Errorf("penalty: a box of %s is too long", l.MaxDelay)
		}
		if l.AfterResponse {
			return fmt.Errorf("after_response: a penalty counts denials, not what responses cost")
		}
	case SlidingLog, InFlight:
		l.burst = 0
		if l.Count > MaxSlidingLogCount {
			return fmt.Errorf("count: %d is above %d, the most %s holds per key (8 bytes each)", l.Count, MaxSlidingLogCount, l.Algorithm)
		}
	case TokenBucket, GCRA, LeakyBucket:
		l.burst = l.Burst
		if l.burst == 0 {
			switch l.Algorithm {
			case TokenBucket:
				l.burst = l.Count
			case GCRA:
				l.burst = 1
			case LeakyBucket:
				// Unbounded by count: MaxDelay alone bounds the queue.
				l.burst = ceilDiv(l.maxDelayUS*l.Count, l.windowUS) + 1
			}
		}
		if l.Algorithm == LeakyBucket && l.MaxDelay <= 0 {
			return fmt.Errorf("max_delay: %s must be above 0 for leaky_bucket (shaping delays requests up to it)", l.MaxDelay)
		}
		if l.Algorithm == LeakyBucket && l.maxDelayUS > maxExact/4/l.Count {
			return fmt.Errorf("max_delay: %s with count %d is too large (max_delay in µs × count must stay under 2^51)", l.MaxDelay, l.Count)
		}
		// The step functions compute (burst+cost)×window with cost ≤ burst, and
		// max_delay×count: keep both exact in Lua.
		if l.burst > maxExact/4/l.windowUS {
			return fmt.Errorf("burst: %d with window %s is too fine-grained (burst × window in µs must stay under 2^51); use a shorter window or fixed_window/sliding_counter", l.burst, FormatWindow(l.Window))
		}
	}
	if l.windowUS > maxExact/8 {
		return fmt.Errorf("window: %s is too long", l.Window)
	}
	if l.AfterResponse && (l.Algorithm == LeakyBucket || l.Algorithm == InFlight) {
		return fmt.Errorf("after_response: %s decides as a request arrives (it delays or holds it), so it cannot be charged after the response", l.Algorithm)
	}
	return nil
}

// PenaltyLimit returns the penalty box that refuses a key for box once its
// policy's other limits have denied it denials times within one window.
func PenaltyLimit(denials int64, window, box time.Duration) Limit {
	return Limit{Name: "penalty", Count: denials, Window: window, Algorithm: Penalty, MaxDelay: box}
}

// MaxCharge is the most one Charge takes from l, in units of cost: a
// response that reports more is charged this much, so an overdrawn limit
// recovers within about a window and every step stays exact. It is Count
// for the windowed algorithms, and for TokenBucket and GCRA the larger of
// Count and the burst, at most what keeps cost × window in µs under 2^51.
// l must have been validated.
func (l *Limit) MaxCharge() int64 {
	switch l.Algorithm {
	case TokenBucket, GCRA:
		return min(max(l.Count, l.burst), maxExact/4/l.windowUS)
	}
	return l.Count
}

// IdleMicros is how long after its last request a key's state under l is
// equivalent to a fresh one, in µs: stores expire idle keys after it.
func (l *Limit) IdleMicros() int64 {
	switch l.Algorithm {
	case SlidingCounter:
		return 2 * l.windowUS
	case TokenBucket, GCRA:
		return (2*l.burst*l.windowUS)/l.Count + 1
	case LeakyBucket:
		return l.maxDelayUS + (2*l.burst*l.windowUS)/l.Count + 1
	case Penalty:
		return max(l.windowUS, l.maxDelayUS)
	case FixedWindow:
		// A calendar window lasts up to 31 or 366 days.
		switch l.months {
		case 1:
			return 31 * dayUS
		case 12:
			return 366 * dayUS
		}
		return l.windowUS
	default:
		return l.windowUS
	}
}

// ParseRate reads "<count>/<window>", such as "600/1m", "100/10s", "5/second"
// or "3600/hour". The window is a duration (ParseWindow), or one of the unit
// names second, minute, hour, day (and s, sec, m, min, h, d) meaning one of
// that unit, or month or year (mo, y) meaning a calendar one. Spaces around
// the parts are ignored.
func ParseRate(s string) (count int64, window time.Duration, err error) {
	countText, windowText, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("rate %q: want <count>/<window>, such as 100/1m", s)
	}
	count, err = strconv.ParseInt(strings.TrimSpace(countText), 10, 64)
	if err != nil || count < 1 {
		return 0, 0, fmt.Errorf("rate %q: count %q must be a whole number of at least 1", s, strings.TrimSpace(countText))
	}
	windowText = strings.TrimSpace(windowText)
	window, ok = unitWindows[windowText]
	if !ok {
		if window, err = ParseWindow(windowText); err != nil {
			return 0, 0, fmt.Errorf("rate %q: %w", s, err)
		}
	}
	return count, window, nil
}

// dayUS is a day in µs.
const dayUS = int64(24 * time.Hour / time.Microsecond)

// unitWindows are the unit names a rate's window may be (ParseRate).
var unitWindows = map[string]time.Duration{
	"s": time.Second, "sec": time.Second, "second": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute,
	"h": time.Hour, "hour": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour,
	"mo": CalendarMonth, "month": CalendarMonth,
	"y": CalendarYear, "year": CalendarYear,
}

// ParseWindow reads a window: a duration as ParseDuration reads it
// ("10s", "1m30s", "1.5d", "1mo"), at least 1µs.
func ParseWindow(s string) (time.Duration, error) {
	w, err := ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("window %w", err)
	}
	if w < time.Microsecond {
		return 0, fmt.Errorf("window %q: must be at least 1µs", s)
	}
	return w, nil
}

// FormatWindow prints w as ParseWindow reads it, preferring whole days
// ("1d") and short units ("1m", not "1m0s").
func FormatWindow(w time.Duration) string {
	switch w {
	case CalendarMonth:
		return "1mo"
	case CalendarYear:
		return "1y"
	}
	day := 24 * time.Hour
	if w >= day && w%day == 0 {
		return strconv.FormatInt(int64(w/day), 10) + "d"
	}
	if w%time.Millisecond != 0 {
		return strconv.FormatInt(int64(w/time.Microsecond), 10) + "us" // ParseDuration's 3 decimals stop at ms
	}
	s := w.String()
	s = strings.Replace(s, "m0s", "m", 1)
	s = strings.Replace(s, "h0m", "h", 1)
	return s
}

// ScaleLimits returns base with every count (and explicit burst) scaled by
// f, at least 1 each.
func ScaleLimits(base []Limit, f float64) []Limit {
	out := make([]Limit, len(base))
	for i, l := range base {
		if l.Algorithm == Penalty {
			out[i] = l // it counts denials, not the upstream's work
			continue
		}
		l.Count = max(1, int64(math.Round(float64(l.Count)*f)))
		if l.Burst > 0 {
			l.Burst = max(1, int64(math.Round(float64(l.Burst)*f)))
		}
		if err := l.Normalize(); err != nil {
			// A smaller count cannot break a limit that validated; keep the
			// configured one if it somehow does.
			l = base[i]
		}
		out[i] = l
	}
	return out
}

// HasBurst reports whether Limit.Burst means something to a: the bucket of
// token_bucket, the burst gcra allows, the queue of leaky_bucket.
func (a Algorithm) HasBurst() bool { return a == TokenBucket || a == GCRA || a == LeakyBucket }

// HasMaxDelay reports whether Limit.MaxDelay means something to a: the
// longest delay of leaky_bucket, the longest wait of in_flight for a slot,
// and a penalty's box.
func (a Algorithm) HasMaxDelay() bool { return a == LeakyBucket || a == InFlight || a == Penalty }
