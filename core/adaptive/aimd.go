package adaptive

// AIMDState is an adaptive factor and when it last moved. Its zero value is
// a factor never judged (AIMD treats Factor 0 as 1).
type AIMDState struct {
	// Factor is the fraction of the configured counts in force, in
	// [MinFactor, 1].
	Factor float64
	// Decreased and Increased are when the factor last went down and up, in
	// µs (0: never).
	Decreased, Increased int64
}

// AIMD is the one adaptive rule: one interval's verdict (congested or not)
// judged at now (µs) moves the factor at most once per interval. Congested,
// it is multiplied by Decrease (never below MinFactor) unless it already
// went down in this interval; healthy, it grows by Increase (never above 1)
// once a whole interval has passed since its last move. So k gateway nodes
// judging the same interval move a shared factor once, not k times.
//
// An interval counts as passed at 7/8 of its length, so a timer tick that
// comes a little early does not skip a move. aimd.lua is its twin, run in
// Redis on the server's TIME; TestAIMDLuaTwin replays both.
func AIMD(s AIMDState, now int64, congested bool, o Options) AIMDState {
	if s.Factor == 0 {
		s.Factor = 1
	}
	interval := o.Interval.Microseconds()
	gap := interval - interval/8
	switch {
	case congested:
		if now-s.Decreased >= gap {
			s.Factor = max(o.MinFactor, s.Factor*o.Decrease)
			s.Decreased = now
		}
	case now-s.Decreased >= gap && now-s.Increased >= gap:
		s.Factor = min(1, s.Factor+o.Increase)
		s.Increased = now
	}
	return s
}
