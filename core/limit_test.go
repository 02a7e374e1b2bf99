package core

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/algo"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]struct {
		n int64
		w time.Duration
	}{
		"600/1m": {600, time.Minute}, "100/10s": {100, 10 * time.Second}, "5/second": {5, time.Second},
		"3600/hour": {3600, time.Hour}, "1/1d": {1, 24 * time.Hour}, " 7 / 1.5d ": {7, 36 * time.Hour},
		"10/min": {10, time.Minute}, "2/250ms": {2, 250 * time.Millisecond},
		"1000/1mo": {1000, algo.CalendarMonth}, "50/month": {50, algo.CalendarMonth}, "9/1y": {9, algo.CalendarYear}, "9/year": {9, algo.CalendarYear},
	} {
		n, w, err := algo.ParseRate(in)
		if err != nil || n != want.n || w != want.w {
			t.Errorf("%q: %d/%v %v, want %d/%v", in, n, w, err, want.n, want.w)
		}
	}
	for in, msg := range map[string]string{
		"100":    "want <count>/<window>",
		"0/1s":   `count "0" must be a whole number of at least 1`,
		"-5/1s":  `count "-5"`,
		"x/1s":   `count "x"`,
		"5/fast": `window "fast": not a duration`,
		"5/0s":   `window "0s": must be at least 1µs`,
		"5/-1d":  `window "-1d": not a duration`,
	} {
		if _, _, err := algo.ParseRate(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, msg)
		}
	}
}

// TestCalendarWindowsReadAndPrint: "1mo" and "1y" read back from what
// FormatWindow prints and from a JSON duration string, and only a
// fixed_window counts them by the calendar.
func TestCalendarWindowsReadAndPrint(t *testing.T) {
	for w, text := range map[time.Duration]string{algo.CalendarMonth: "1mo", algo.CalendarYear: "1y", 30 * 24 * time.Hour: "30d"} {
		if got := algo.FormatWindow(w); got != text {
			t.Errorf("FormatWindow(%v) = %q, want %q", w, got, text)
		}
		if back, err := algo.ParseWindow(text); err != nil || back != w {
			t.Errorf("ParseWindow(%q) = %v %v, want %v", text, back, err, w)
		}
		var d algo.Duration
		if err := d.UnmarshalJSON([]byte(`"` + text + `"`)); err != nil || time.Duration(d) != w {
			t.Errorf("Duration %q = %v %v, want %v", text, time.Duration(d), err, w)
		}
	}
	both := MustPolicy("ids", PolicyOptions{}, algo.Limit{Count: 3, Window: algo.CalendarMonth, Algorithm: algo.FixedWindow}, algo.Limit{Count: 5, Window: 30 * 24 * time.Hour, Algorithm: algo.FixedWindow})
	if both.LimitID(0) == both.LimitID(1) {
		t.Errorf("a calendar month and a 30-day window share counters: both %q", both.LimitID(0))
	}
	for a, months := range map[algo.Algorithm]int64{algo.FixedWindow: 1, algo.SlidingCounter: 0, algo.TokenBucket: 0} {
		p := MustPolicy("cal", PolicyOptions{}, algo.Limit{Count: 5, Window: algo.CalendarMonth, Algorithm: a})
		if got := p.Limits()[0].CalendarMonths(); got != months {
			t.Errorf("%v over 1mo: %d calendar months, want %d", a, got, months)
		}
	}
}

func TestLimitValidationNamesFieldAndValue(t *testing.T) {
	for _, c := range []struct {
		l    algo.Limit
		want string
	}{
		{algo.Limit{Count: 0, Window: time.Second}, "count: 0 must be at least 1"},
		{algo.Limit{Count: -4, Window: time.Second}, "count: -4"},
		{algo.Limit{Count: 1, Window: 0}, "window: 0s must be at least 1µs"},
		{algo.Limit{Count: 1, Window: time.Second, Burst: -1, Algorithm: algo.TokenBucket}, "burst: -1 must be at least 1"},
		{algo.Limit{Count: 1, Window: time.Second, Algorithm: 99}, "algorithm: unknown value 99"},
		{algo.Limit{Count: 10, Window: time.Second, Algorithm: algo.LeakyBucket}, "max_delay: 0s must be above 0 for leaky_bucket"},
		{algo.Limit{Count: 2_000_000, Window: time.Second, Algorithm: algo.SlidingLog}, "count: 2000000 is above 1000000"},
		{algo.Limit{Count: 1_000_000_000, Window: 24 * time.Hour, Algorithm: algo.TokenBucket}, "burst: 1000000000 with window 1d is too fine-grained"},
	} {
		err := c.l.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.l, err, c.want)
		}
	}
	_, err := NewPolicy("api", PolicyOptions{}, algo.Limit{Count: 5, Window: time.Second}, algo.Limit{Count: 0, Window: time.Minute})
	if err == nil || err.Error() != `policy "api" limit 2 (0/1m): count: 0 must be at least 1` {
		t.Errorf("policy error: %v", err)
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range algo.Algorithms {
		if got, err := algo.ParseAlgorithm(a.String()); err != nil || got != a {
			t.Errorf("%v: %v %v", a, got, err)
		}
	}
	if _, err := algo.ParseAlgorithm("leaky"); err == nil || !strings.Contains(err.Error(), `unknown algorithm "leaky"`) {
		t.Errorf("unknown algorithm: %v", err)
	}
}

// Counts and bursts past 15 digits cannot be shown in a RateLimit header
// (RFC 9651 integers), so they are refused when the config loads.
func TestCountsStayWithinStructuredFieldIntegers(t *testing.T) {
	ok := algo.Limit{Count: algo.MaxCount, Window: time.Hour, Algorithm: algo.FixedWindow}
	if err := ok.Validate(); err != nil {
		t.Fatalf("15 digits refused: %v", err)
	}
	for _, l := range []algo.Limit{
		{Count: algo.MaxCount + 1, Window: time.Hour, Algorithm: algo.FixedWindow},
		{Count: 10, Window: time.Hour, Algorithm: algo.TokenBucket, Burst: algo.MaxCount + 1},
	} {
		if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "largest integer a RateLimit header can carry") {
			t.Errorf("%+v: %v", l, err)
		}
	}
}
