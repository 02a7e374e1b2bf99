package algo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Duration is a length of time in a spec: in JSON a string such as "500ms",
// "1m30s" or "1d", or a whole number of nanoseconds (as some gateways write
// durations).
type Duration time.Duration

// UnmarshalJSON reads a duration string or a number of nanoseconds.
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

// ParseDuration reads a Go duration ("1m30s", "-1s"), a number of days
// ("1d", "1.5d"), or a calendar month or year ("1mo", "1y": CalendarMonth,
// CalendarYear).
func ParseDuration(s string) (time.Duration, error) {
	switch s {
	case "1mo":
		return CalendarMonth, nil
	case "1y":
		return CalendarYear, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok && days != "" {
		n, err := strconv.ParseFloat(days, 64)
		if err == nil && n >= -100*365 && n <= 100*365 {
			return time.Duration(n * float64(24*time.Hour)), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (want e.g. 500ms, 1m, 1d)", s)
	}
	return d, nil
}
