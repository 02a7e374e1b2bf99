package algo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Duration is a length of time in a spec: in JSON a string ParseDuration
// reads ("500ms", "1m30s", "1d"), or a whole number of nanoseconds (as
// some gateways write durations).
type Duration time.Duration

// UnmarshalJSON reads a duration string or a number of nanoseconds. A
// string that is no duration fails with a *DurationError.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var ns int64
	if err := json.Unmarshal(b, &ns); err != nil {
		return fmt.Errorf("duration %s: want a string such as \"1m\" or nanoseconds", b)
	}
	*d = Duration(ns)
	return nil
}

// DurationExamples is the list of examples every refusal of a duration
// gives, wherever it was written.
const DurationExamples = "want e.g. 250ms, 10s, 1m30s, 1.5h, 1d, 1mo or 1y"

// NotADuration is what every refusal of a duration says, after the text
// or the field.
const NotADuration = "not a duration (" + DurationExamples + ")"

// MaxDurationText is the longest duration ParseDuration reads, in bytes.
const MaxDurationText = 20

// DurationError is a text that is no duration.
type DurationError struct {
	Text string // as written
}

func (e *DurationError) Error() string {
	return fmt.Sprintf("%q: %s", e.Text, NotADuration)
}

// durationUnits are the units of a duration's terms, longest name first,
// with the most integer digits a term in each may have: the bounds keep
// every duration of MaxDurationText bytes under 35 years (34.2 at most,
// "99999h99999h99999h9m"), within the longest window a limit takes (2^50
// µs, 35.7 years), so a duration the grammar reads is never refused as too
// long, and none overflows.
var durationUnits = []struct {
	name      string
	unit      time.Duration
	maxDigits int
	whole     bool // no decimals
}{
	{"ms", time.Millisecond, 9, false},
	{"us", time.Microsecond, 12, true},
	{"h", time.Hour, 5, false},
	{"m", time.Minute, 6, false},
	{"s", time.Second, 8, false},
}

// ParseDuration reads a duration, the one grammar of every duration in a
// config: one or more terms <number><unit> with unit h, m, s, ms or us
// ("1h30m", "1.5m", "250ms"); or a number of days alone ("1d", "1.5d"); or
// a calendar month or year ("1mo", "1y": CalendarMonth, CalendarYear). A
// number has at most 3 decimals, so every duration is a whole number of
// µs; us takes whole numbers; whole parts have at most 4 digits for d, 5
// for h, 6 for m, 8 for s, 9 for ms and 12 for us. At most MaxDurationText bytes; no sign, no
// spaces. "0s" reads as 0: callers that need more say so.
func ParseDuration(s string) (time.Duration, error) {
	switch s {
	case "1mo":
		return CalendarMonth, nil
	case "1y":
		return CalendarYear, nil
	}
	if len(s) == 0 || len(s) > MaxDurationText {
		return 0, &DurationError{s}
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, rest, ok := durationNumber(days, 4, false, 24*time.Hour)
		if !ok || rest != "" {
			return 0, &DurationError{s}
		}
		return n, nil
	}
	var total time.Duration
	for rest := s; rest != ""; {
		var term time.Duration
		ok := false
		for _, u := range durationUnits {
			// The number ends at the first letter; the unit follows it.
			end := strings.IndexFunc(rest, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }) // first non-number byte
			if end <= 0 || !strings.HasPrefix(rest[end:], u.name) {
				continue
			}
			var left string
			if term, left, ok = durationNumber(rest[:end], u.maxDigits, u.whole, u.unit); !ok || left != "" {
				return 0, &DurationError{s}
			}
			rest = rest[end+len(u.name):]
			break
		}
		if !ok {
			return 0, &DurationError{s}
		}
		total += term
	}
	return total, nil
}

// durationNumber reads a number of unit at the start of s: up to maxDigits
// digits, then optionally a point and 1 to 3 decimals (none if whole). It
// returns what follows the number.
func durationNumber(s string, maxDigits int, whole bool, unit time.Duration) (time.Duration, string, bool) {
	var n, thousandths int64
	i := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		n = n*10 + int64(s[i]-'0')
	}
	if i == 0 || i > maxDigits {
		return 0, s, false
	}
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for scale := int64(100); j < len(s) && s[j] >= '0' && s[j] <= '9'; j, scale = j+1, scale/10 {
			if scale == 0 {
				return 0, s, false // a fourth decimal
			}
			thousandths += int64(s[j]-'0') * scale
		}
		if whole || j == i+1 {
			return 0, s, false // decimals of us, or a point with none
		}
		i = j
	}
	return time.Duration(n)*unit + time.Duration(thousandths)*(unit/1000), s[i:], true
}
