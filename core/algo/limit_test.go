package algo

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/durationcorpus"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]struct {
		n int64
		w time.Duration
	}{
		"600/1m": {600, time.Minute}, "100/10s": {100, 10 * time.Second}, "5/second": {5, time.Second},
		"3600/hour": {3600, time.Hour}, "1/1d": {1, 24 * time.Hour}, " 7 / 1.5d ": {7, 36 * time.Hour},
		"10/min": {10, time.Minute}, "2/250ms": {2, 250 * time.Millisecond},
		"1000/1mo": {1000, CalendarMonth}, "50/month": {50, CalendarMonth}, "9/1y": {9, CalendarYear}, "9/year": {9, CalendarYear},
	} {
		n, w, err := ParseRate(in)
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
		if _, _, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, msg)
		}
	}
}

// TestCalendarWindowsReadAndPrint: "1mo" and "1y" read back from what
// FormatWindow prints and from a JSON duration string, and only a
// fixed_window counts them by the calendar.
func TestCalendarWindowsReadAndPrint(t *testing.T) {
	for w, text := range map[time.Duration]string{CalendarMonth: "1mo", CalendarYear: "1y", 30 * 24 * time.Hour: "30d"} {
		if got := FormatWindow(w); got != text {
			t.Errorf("FormatWindow(%v) = %q, want %q", w, got, text)
		}
		if back, err := ParseWindow(text); err != nil || back != w {
			t.Errorf("ParseWindow(%q) = %v %v, want %v", text, back, err, w)
		}
		var d Duration
		if err := d.UnmarshalJSON([]byte(`"` + text + `"`)); err != nil || time.Duration(d) != w {
			t.Errorf("Duration %q = %v %v, want %v", text, time.Duration(d), err, w)
		}
	}
	for a, months := range map[Algorithm]int64{FixedWindow: 1, SlidingCounter: 0, TokenBucket: 0} {
		l := Limit{Count: 5, Window: CalendarMonth, Algorithm: a}
		if err := l.Normalize(); err != nil {
			t.Fatal(err)
		}
		if got := l.CalendarMonths(); got != months {
			t.Errorf("%v over 1mo: %d calendar months, want %d", a, got, months)
		}
	}
}

func TestLimitValidationNamesFieldAndValue(t *testing.T) {
	for _, c := range []struct {
		l    Limit
		want string
	}{
		{Limit{Count: 0, Window: time.Second}, "count: 0 must be at least 1"},
		{Limit{Count: -4, Window: time.Second}, "count: -4"},
		{Limit{Count: 1, Window: 0}, "window: 0s must be at least 1µs"},
		{Limit{Count: 1, Window: time.Second, Burst: -1, Algorithm: TokenBucket}, "burst: -1 must be at least 1"},
		{Limit{Count: 1, Window: time.Second, Algorithm: 99}, "algorithm: unknown value 99"},
		{Limit{Count: 10, Window: time.Second, Algorithm: LeakyBucket}, "max_delay: 0s must be above 0 for leaky_bucket"},
		{Limit{Count: 2_000_000, Window: time.Second, Algorithm: SlidingLog}, "count: 2000000 is above 1000000"},
		{Limit{Count: 1_000_000_000, Window: 24 * time.Hour, Algorithm: TokenBucket}, "burst: 1000000000 with window 1d is too fine-grained"},
	} {
		err := c.l.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.l, err, c.want)
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range Algorithms {
		if got, err := ParseAlgorithm(a.String()); err != nil || got != a {
			t.Errorf("%v: %v %v", a, got, err)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil || !strings.Contains(err.Error(), `unknown algorithm "leaky"`) {
		t.Errorf("unknown algorithm: %v", err)
	}
}

// Counts and bursts past 15 digits cannot be shown in a RateLimit header
// (RFC 9651 integers), so they are refused when the config loads.
func TestCountsStayWithinStructuredFieldIntegers(t *testing.T) {
	ok := Limit{Count: MaxCount, Window: time.Hour, Algorithm: FixedWindow}
	if err := ok.Validate(); err != nil {
		t.Fatalf("15 digits refused: %v", err)
	}
	for _, l := range []Limit{
		{Count: MaxCount + 1, Window: time.Hour, Algorithm: FixedWindow},
		{Count: 10, Window: time.Hour, Algorithm: TokenBucket, Burst: MaxCount + 1},
	} {
		if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "largest integer a RateLimit header can carry") {
			t.Errorf("%+v: %v", l, err)
		}
	}
}

// CountsUntil is when a window's count stops mattering: a decision just
// before it depends on that count, one at it or after does not.
func TestCountsUntilIsWhenAWindowStopsCounting(t *testing.T) {
	for _, l := range []Limit{
		{Count: 10, Window: time.Minute, Algorithm: FixedWindow},
		{Count: 10, Window: time.Minute, Algorithm: SlidingCounter},
		{Count: 10, Window: CalendarMonth, Algorithm: FixedWindow},
	} {
		lim := l
		if err := lim.Normalize(); err != nil {
			t.Fatal(err)
		}
		start := time.Date(2026, time.February, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		s, _ := Step(&lim, State{}, start, 0)
		windows, _ := CountedWindows(&lim, s)
		if windows[0].Start != start {
			t.Fatalf("%v: the window holding %d starts at %d", l, start, windows[0].Start)
		}
		until := CountsUntil(&lim, start)
		remaining := func(count, at int64) int64 {
			_, r := Step(&lim, WithCounts(&lim, s, [2]int64{count, 0}), at, 0)
			return r.Remaining
		}
		// The last instant a sliding counter still weighs the window enough
		// to show in a whole unit is half a window before its end.
		before := until - 1
		if l.Algorithm == SlidingCounter {
			before = until - lim.windowUS/2
		}
		if remaining(0, before) == remaining(10, before) {
			t.Errorf("%v: the window's count does not matter at %d, before CountsUntil %d", l, before, until)
		}
		if remaining(0, until) != remaining(10, until) {
			t.Errorf("%v: the window's count still matters at CountsUntil %d", l, until)
		}
	}
	month := Limit{Count: 1, Window: CalendarMonth, Algorithm: FixedWindow}
	if err := month.Normalize(); err != nil {
		t.Fatal(err)
	}
	feb := time.Date(2026, time.February, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	if got, want := CountsUntil(&month, feb), time.Date(2026, time.March, 1, 0, 0, 0, 0, time.UTC).UnixMicro(); got != want {
		t.Errorf("February's window counts until %d, want March 1st %d", got, want)
	}
}

// TestWindowGrammar: ParseWindow reads every window of the one corpus the
// front doors share as written there, and refuses the others in one
// wording.
func TestWindowGrammar(t *testing.T) {
	for _, c := range durationcorpus.Windows {
		got, err := ParseWindow(c.Text)
		switch {
		case c.Want != 0 && (err != nil || got != c.Want):
			t.Errorf("%q: %v %v, want %v", c.Text, got, err, c.Want)
		case c.Want == 0 && err == nil:
			t.Errorf("%q: read as %v, want it refused", c.Text, got)
		case c.Want == 0 && !strings.Contains(err.Error(), "not a duration ("+DurationExamples+")") && !strings.Contains(err.Error(), "must be at least 1µs"):
			t.Errorf("%q: %v, not in the grammar's words", c.Text, err)
		}
	}
	// What FormatWindow prints reads back.
	for _, w := range []time.Duration{time.Microsecond, 1500 * time.Microsecond, 90 * time.Second, 36 * time.Hour, time.Hour + time.Millisecond, 1001 * time.Microsecond} {
		if back, err := ParseWindow(FormatWindow(w)); err != nil || back != w {
			t.Errorf("FormatWindow(%v) = %q reads back as %v %v", w, FormatWindow(w), back, err)
		}
	}
}
