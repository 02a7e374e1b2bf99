package kongplugin

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/tollgate/tollgate/core/algo"
)

// durationPatterns are algo.ParseDuration's grammar in Kong's schema
// language: Lua patterns, each of which a duration must not match. Lua
// patterns cannot say "one or more <number><unit> terms", so each pattern
// forbids one local mistake; together they refuse exactly what the grammar
// refuses (TestKongWindowPatternsAreTheGrammar checks every string of up
// to 5 bytes near it and random strings of its terms, and real Kong runs
// the corpus in TestKongAdminAPIWindowsAsTheGrammar). Kong runs match_none
// before match_all and stops at the first pattern that matches, so all of
// them are match_none, with the grammar's words.
var durationPatterns = []string{
	`^%D`, `[^%d%.hmsudoy]`, `[^hmsdoy]$`, // a digit first, a unit last, nothing else
	strings.Repeat(".", algo.MaxDurationText+1), // too long
	`%.%D`, `%D%.`, `%.%d*%.`, `%.%d%d%d%d`, // a point between digits, once, then at most 3 decimals
	`%a%a%a`, `h%a`, `s%a`, `u[^s]`, `m[^%dso]`, // units: h, m, s, ms, us
	`d.`, `%a.*d`, // days: a number of days alone
	`o.`, `[^m]o`, `[^1]mo`, `..mo`, `y.`, `[^1]y`, `..y`, // 1mo and 1y alone
	`%.%d*us`, // us in whole numbers
	// Whole parts of at most 5 digits for h, 4 for d, 6 for m, 8 for s, 9
	// for ms and 12 for us.
	`%d%d%d%d%d%d%.?%d*h`, `%d%d%d%d%d%.?%d*d`, `%d%d%d%d%d%d%d%.?%d*m[^so]`, `%d%d%d%d%d%d%d%.?%d*m$`,
	`%d%d%d%d%d%d%d%d%d%.?%d*s`, `%d%d%d%d%d%d%d%d%d%d%.?%d*ms`, `%d%d%d%d%d%d%d%d%d%d%d%d%dus`,
}

// withDurationPatterns puts the grammar's patterns in schema.json where it
// says "match_none": "duration", and for a window, which must be at least
// 1µs, where it says "match_none": "window".
func withDurationPatterns(schema []byte) []byte {
	type match struct {
		Pattern string `json:"pattern"`
		Err     string `json:"err"`
	}
	var duration []match
	for _, p := range durationPatterns {
		duration = append(duration, match{p, algo.NotADuration})
	}
	window := append(duration[:len(duration):len(duration)], match{`^[^1-9]*$`, "must be at least 1µs"})
	d, _ := json.Marshal(duration)
	w, _ := json.Marshal(window)
	schema = bytes.ReplaceAll(schema, []byte(`"match_none": "duration"`), append([]byte(`"match_none": `), d...))
	return bytes.ReplaceAll(schema, []byte(`"match_none": "window"`), append([]byte(`"match_none": `), w...))
}
