package redis

import (
	"context"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
)

// factorScript applies one node's verdict to a fleet-wide AIMD factor, at
// most one decrease per interval and an increase only after an interval
// without decrease, so k nodes judging the same interval move the factor
// once, not k times. Time is Redis's.
var factorScript = goredis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local congested, decrease, increase, minf, interval = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HMGET', KEYS[1], 'f', 'd', 'i')
local f, d, i = tonumber(v[1]) or 1, tonumber(v[2]) or 0, tonumber(v[3]) or 0
if congested == 1 then
  if now - d >= interval then
    f = math.max(minf, f * decrease)
    redis.call('HSET', KEYS[1], 'f', tostring(f), 'd', now)
  end
elseif now - d >= interval and now - i >= interval then
  f = math.min(1, f + increase)
  redis.call('HSET', KEYS[1], 'f', tostring(f), 'i', now)
end
redis.call('PEXPIRE', KEYS[1], math.floor(interval / 1000) * 60 + 1000)
return tostring(f)
`)

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
	c := 0
	if congested {
		c = 1
	}
	ctx, cancel := context.WithTimeout(ctx, f.s.timeout)
	defer cancel()
	v, err := factorScript.Run(ctx, f.s.client, []string{f.key}, c, o.Decrease, o.Increase, o.MinFactor, o.Interval.Microseconds()).Text()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(v, 64)
}
