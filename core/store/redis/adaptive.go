package redis

import (
	"context"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core/adaptive"
)

// aimdScript and gradientScript are adaptive.AIMD's and adaptive.Gradient's Lua
// twins, run on the server's TIME.
var (
	aimdScript     = goredis.NewScript(adaptive.AIMDLua)
	gradientScript = goredis.NewScript(adaptive.GradientLua)
)

// factorSync keeps one adaptive factor in Redis.
type factorSync struct {
	s   *Store
	key string
}

// FactorSync returns a adaptive.FactorSync that shares the adaptive factor of
// the policy scope (a name all nodes agree on) through this store's Redis.
func (s *Store) FactorSync(scope string) adaptive.FactorSync {
	return &factorSync{s: s, key: s.prefix + "{adaptive:" + scope + "}"}
}

// SyncFactor applies this node's interval (its signals to Gradient, its
// verdict to AIMD) to the shared state and returns the shared factor.
func (f *factorSync) SyncFactor(ctx context.Context, sig adaptive.Signals, congested bool, o adaptive.Options) (float64, error) {
	now := int64(-1)
	if f.s.clock != nil {
		now = f.s.clock.NowMicros()
	}
	if o.Controller == adaptive.ControllerAIMD {
		return runAIMD(ctx, f.s, f.key, now, congested, o)
	}
	return runGradient(ctx, f.s, f.key, now, sig, o)
}

// runGradient runs gradient.lua once on key at now (-1: the server's TIME);
// o must have its defaults filled in (as an Adaptive's options have).
func runGradient(ctx context.Context, s *Store, key string, now int64, sig adaptive.Signals, o adaptive.Options) (float64, error) {
	paced := 0
	if o.Paced {
		paced = 1
	}
	return runFactorScript(ctx, s, gradientScript, key, now, sig.Started, sig.Answered, sig.Failed, sig.Latency,
		o.MinFactor, o.ErrorRate, o.Tolerance, o.LatencyTarget.Microseconds(), o.Decrease, o.Increase, o.Interval.Microseconds(), o.MinSamples, sig.Denied, sig.Admitted, paced,
		min(1, max(0, sig.Stalled)))
}

// runFactorScript runs an adaptive rule's script on key, within the
// store's timeout, and reads back the factor it returns.
func runFactorScript(ctx context.Context, s *Store, script *goredis.Script, key string, args ...any) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := script.Run(ctx, s.client, []string{key}, args...).Text()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(v, 64)
}

// runAIMD runs aimd.lua once on key at now (-1: the server's TIME).
func runAIMD(ctx context.Context, s *Store, key string, now int64, congested bool, o adaptive.Options) (float64, error) {
	c := 0
	if congested {
		c = 1
	}
	return runFactorScript(ctx, s, aimdScript, key, now, c, o.Decrease, o.Increase, o.MinFactor, o.Interval.Microseconds())
}
