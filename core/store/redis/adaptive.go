package redis

import (
	"context"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
)

// aimdScript is core.AIMD's Lua twin, run on the server's TIME.
var aimdScript = goredis.NewScript(core.AIMDLua)

// factorSync keeps one adaptive factor in Redis.
type factorSync struct {
	s   *Store
	key string
}

// FactorSync returns a core.FactorSync that shares the adaptive factor of
// the policy scope (a name all nodes agree on) through this store's Redis.
func (s *Store) FactorSync(scope string) core.FactorSync {
	return &factorSync{s: s, key: s.prefix + "{adaptive:" + scope + "}"}
}

// SyncFactor applies congested to the shared factor and returns it.
func (f *factorSync) SyncFactor(ctx context.Context, congested bool, o core.AdaptiveOptions) (float64, error) {
	now := int64(-1)
	if f.s.clock != nil {
		now = f.s.clock.NowMicros()
	}
	return runAIMD(ctx, f.s, f.key, now, congested, o)
}

// runAIMD runs aimd.lua once on key at now (-1: the server's TIME).
func runAIMD(ctx context.Context, s *Store, key string, now int64, congested bool, o core.AdaptiveOptions) (float64, error) {
	c := 0
	if congested {
		c = 1
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := aimdScript.Run(ctx, s.client, []string{key}, now, c, o.Decrease, o.Increase, o.MinFactor, o.Interval.Microseconds()).Text()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(v, 64)
}
