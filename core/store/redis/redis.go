// Package redis is tollgate's shared store: many gateway nodes decide
// against one Redis (standalone, Sentinel or Cluster) and so enforce one
// exact limit together.
//
// Every decision runs one Lua call that applies the policy's stacked
// limits all or nothing, with the same arithmetic as the Go step
// functions, so the conformance suite gets identical decisions from this
// store and the memory store: an FCALL of DecideLibrary's function, which
// the store loads into Redis 7 and later, or where Redis refuses functions
// an EVALSHA of the same code as a script (DecideLua). Concurrent
// decisions share round trips: on standalone Redis and Sentinel a batch of
// them is one call of the code's batch form, on a Cluster a pipeline of
// one call each. Time
// comes from the Redis server's TIME, so nodes with skewed clocks agree;
// tests may inject a clock instead.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/redis/denycache"
	"github.com/tollgate/tollgate/core/store/redis/keyname"
	"github.com/tollgate/tollgate/core/tlstrust"
)

var (
	decideScript = goredis.NewScript(DecideLua)
	leaseScript  = goredis.NewScript(leaseLua)
	cancelScript = goredis.NewScript(cancelLua)
	countScript  = goredis.NewScript(countLua)
)

// DefaultPrefix starts every key the store writes.
const DefaultPrefix = "tollgate:"

// DefaultTimeout bounds one decision's round trip when Options.Timeout is 0.
const DefaultTimeout = 500 * time.Millisecond

// Settings say how to reach Redis, as a gateway's config writes them (an
// adapter whose config names them otherwise maps its names onto these):
// the one declaration from which the store's Options,
// the configs' store specs and a store's identity are derived. Set URL, or
// Addrs (the server, a Cluster's seeds, or the Sentinels with Master).
type Settings struct {
	// URL is a redis:// or rediss:// URL (user, password, host:port, /db);
	// the fields below override what it sets.
	URL string `json:"url,omitempty"`
	// Addrs are host:port addresses: the server, the Cluster's seed nodes, or
	// the Sentinels.
	Addrs []string `json:"addrs,omitempty"`
	// Master is the Sentinel master's name; set it to use Sentinel.
	Master string `json:"master,omitempty"`
	// Username and Password authenticate to Redis (ACL or requirepass).
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// DB is the database number (standalone and Sentinel only).
	DB int `json:"db,omitempty"`
	// SentinelUsername and SentinelPassword authenticate to the Sentinels.
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// TLS enables TLS; TLSServerName overrides the name verified, and
	// TLSSkipVerify turns verification off.
	TLS           bool   `json:"tls,omitempty"`
	TLSServerName string `json:"tls_server_name,omitempty"`
	TLSSkipVerify bool   `json:"tls_skip_verify,omitempty"`
	// TLSCA is a PEM file of the CA certificates that verify the server
	// (turning TLS on); empty means the system's (SSL_CERT_FILE names
	// another file for the whole process).
	TLSCA string `json:"tls_ca,omitempty"`
	// TLSMaxChain bounds the certificates of a verified chain, the
	// server's and the trusted CA's included (2: the server's certificate
	// signed by a trusted CA directly); 0 means no bound.
	TLSMaxChain int `json:"tls_max_chain,omitempty"`
	// Timeout bounds dialing, reading and writing for one decision; 0 means
	// DefaultTimeout.
	Timeout algo.Duration `json:"timeout,omitempty"`
	// PoolSize is the connections per node; 0 means go-redis's default
	// (10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`
	// Prefix starts every key; empty means DefaultPrefix.
	Prefix string `json:"prefix,omitempty"`
}

// Options configures a Store: the Settings a config gives, and how the
// store runs.
type Options struct {
	Settings
	// Cluster makes Addrs the seeds of a Redis Cluster.
	Cluster bool
	// Clock, if set, replaces the server's TIME (for tests).
	Clock core.Clock
	// Batch is the most decisions sent in one round trip (one call of the
	// decide code's batch form, or on a Cluster one pipeline); 0 means 64,
	// and 1 sends each decision alone (one call per round trip).
	Batch int
	// Lanes is how many batches may be in flight at once; 0 means 2 (one
	// filling while one is in Redis: more lanes send smaller batches, which
	// cost Redis more per decision).
	Lanes int
	// NoDenyCache turns off the local deny cache, which denies a key Redis
	// just denied without asking Redis again until its RetryAfter passes.
	NoDenyCache bool
}

// Store is the Redis store.
type Store struct {
	client goredis.UniversalClient
	// prober answers Ping on connections of its own: a breaker probing a
	// dead Redis must not run up the decision pool's dial errors, after
	// which go-redis redials only once a second and recovery lags.
	prober  goredis.UniversalClient
	prefix  string
	clock   core.Clock
	owned   bool
	timeout time.Duration
	batch   *batcher // nil: one call per decision
	decider *decider
	denies  *denycache.Cache
	local   core.Clock // the deny cache's clock
}

// quietLogs silences go-redis's own log (process-wide, once a tollgate Redis
// store opens): it writes a line for every failed dial, several a second
// while Redis is down, and the failover store already reports the store's
// state once per change.
var quietLogs sync.Once

type discardLog struct{}

func (discardLog) Printf(context.Context, string, ...any) {}

// New validates opts, connects lazily and returns the store. Errors name the
// option and value at fault.
func New(opts Options) (*Store, error) {
	uo, err := universalOptions(opts)
	if err != nil {
		return nil, err
	}
	quietLogs.Do(func() { goredis.SetLogger(discardLog{}) })
	s := NewFromClient(goredis.NewUniversalClient(uo), opts)
	if !uo.IsClusterMode {
		// (A Cluster client learns of failovers from its own failed calls,
		// so it probes with itself.)
		po := *uo
		po.PoolSize, po.MinIdleConns = 1, 0
		s.prober = goredis.NewUniversalClient(&po)
	}
	s.owned = true
	s.timeout = uo.ReadTimeout
	return s, nil
}

// NewFromClient returns a store over an existing client; Close leaves the
// client open. Only opts.Prefix, opts.Clock and opts.Timeout are used.
func NewFromClient(c goredis.UniversalClient, opts Options) *Store {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	timeout := time.Duration(opts.Timeout)
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	s := &Store{client: c, prober: c, prefix: prefix, clock: opts.Clock, timeout: timeout, local: opts.Clock, decider: new(decider)}
	if s.local == nil {
		s.local = core.NewMonotonicClock()
	}
	if !opts.NoDenyCache {
		s.denies = denycache.New()
	}
	batch, lanes := opts.Batch, opts.Lanes
	if batch == 0 {
		batch = 64
	}
	if lanes <= 0 {
		lanes = 2
	}
	if batch > 1 {
		s.batch = newBatcher(c, s.decider, lanes, batch, timeout)
	}
	return s
}

// CheckOptions reports what New would refuse in o (its URL, addresses and
// TLS settings), without connecting.
func CheckOptions(o Options) error {
	_, err := universalOptions(o)
	return err
}

func universalOptions(o Options) (*goredis.UniversalOptions, error) {
	if strings.ContainsAny(o.Prefix, "{}") {
		// A brace would move the Cluster hash tag onto the prefix: every
		// key in one slot, or a request's keys over several.
		return nil, fmt.Errorf("prefix: %q: braces are not allowed (they would choose Redis Cluster's hash slot)", o.Prefix)
	}
	uo := &goredis.UniversalOptions{}
	if o.URL != "" && !strings.Contains(o.URL, "://") {
		// host:port alone: Go's URL parser would say "first path segment
		// in URL cannot contain colon".
		return nil, fmt.Errorf("url: %q has no scheme: write %s (rediss:// for TLS)", redactURL("redis://" + o.URL)[len("redis://"):], redactURL("redis://"+o.URL))
	}
	if o.URL != "" {
		parsed, err := goredis.ParseURL(o.URL)
		if err != nil {
			return nil, fmt.Errorf("url: %q: %w", redactURL(o.URL), err)
		}
		uo.Addrs = []string{parsed.Addr}
		uo.Username, uo.Password, uo.DB, uo.TLSConfig = parsed.Username, parsed.Password, parsed.DB, parsed.TLSConfig
	}
	if len(o.Addrs) > 0 {
		uo.Addrs = o.Addrs
	}
	if len(uo.Addrs) == 0 {
		return nil, errors.New("addrs: need a URL or at least one address")
	}
	for _, a := range uo.Addrs {
		if err := checkAddr(a); err != nil {
			field := "addrs"
			if len(o.Addrs) == 0 {
				field = "url"
			}
			return nil, fmt.Errorf("%s: %w", field, err)
		}
	}
	if o.Cluster && o.Master != "" {
		return nil, errors.New("cluster and master_name: choose Redis Cluster or Sentinel, not both")
	}
	if o.Cluster && o.DB != 0 {
		return nil, fmt.Errorf("db: %d, but Redis Cluster has only database 0", o.DB)
	}
	if o.DB < 0 {
		return nil, fmt.Errorf("db: %d must not be negative", o.DB)
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("timeout: %s must not be negative", time.Duration(o.Timeout))
	}
	if o.PoolSize < 0 {
		return nil, fmt.Errorf("pool_size: %d must not be negative", o.PoolSize)
	}
	if o.Batch < 0 || o.Batch > maxBatch {
		return nil, fmt.Errorf("batch: %d must be between 0 and %d (the most decisions whose reply a gateway reads)", o.Batch, maxBatch)
	}
	if o.Username != "" {
		uo.Username = o.Username
	}
	if o.Password != "" {
		uo.Password = o.Password
	}
	if o.DB != 0 {
		uo.DB = o.DB
	}
	uo.MasterName = o.Master
	uo.SentinelUsername, uo.SentinelPassword = o.SentinelUsername, o.SentinelPassword
	uo.IsClusterMode = o.Cluster
	if o.TLS || o.TLSServerName != "" || o.TLSSkipVerify || o.TLSCA != "" {
		if uo.TLSConfig == nil {
			uo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		uo.TLSConfig.ServerName = o.TLSServerName
		uo.TLSConfig.InsecureSkipVerify = o.TLSSkipVerify
		if o.TLSCA != "" {
			roots, err := tlstrust.CAFile(o.TLSCA)
			if err != nil {
				return nil, fmt.Errorf("tls_ca: %w", err)
			}
			uo.TLSConfig.RootCAs = roots
		}
		if o.TLSMaxChain < 0 {
			return nil, fmt.Errorf("tls_max_chain: %d must not be negative", o.TLSMaxChain)
		}
		if most := o.TLSMaxChain; most > 0 && !o.TLSSkipVerify {
			uo.TLSConfig.VerifyConnection = tlstrust.MaxChain(most, "tls_max_chain")
		}
	}
	timeout := time.Duration(o.Timeout)
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	uo.DialTimeout, uo.ReadTimeout, uo.WriteTimeout = timeout, timeout, timeout
	uo.PoolTimeout = timeout
	uo.PoolSize = o.PoolSize
	// A rate limiter must answer within its timeout: no retries.
	uo.MaxRetries = -1
	uo.DialerRetries = 1
	uo.Dialer = newBoundedDialer(uo)
	return uo, nil
}

// checkAddr refuses an address no connection can be made to: not
// host:port, a port outside 0-65535, or a host that is neither an IP
// address nor a host name.
func checkAddr(a string) error {
	if _, port, ok := cutLast(a, ':'); !ok || port == "" {
		return fmt.Errorf("%q is not host:port", a)
	} else if _, err := strconv.Atoi(port); err != nil {
		return fmt.Errorf("%q has port %q, not a number", a, port)
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port (an IPv6 address is written [::1]:6379): %v", a, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 { // 0, as gateways' port types allow
		return fmt.Errorf("%q has port %s, outside 0-65535", a, port)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if host == "" || len(host) > 253 || strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != "" {
		return fmt.Errorf("%q: host %q is neither an IP address nor a host name", a, host)
	}
	return nil
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// redactURL hides a URL's password in error messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// Client returns the underlying go-redis client.
func (s *Store) Client() goredis.UniversalClient { return s.client }

// Close stops the pipelines and closes the client if New created it.
func (s *Store) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	if s.owned {
		if s.prober != s.client {
			return errors.Join(s.prober.Close(), s.client.Close())
		}
		return s.client.Close()
	}
	return nil
}

// Keys returns the Redis keys holding key's state under p (package
// keyname): first the hash, with one field per limit (named by its limit
// id), then per limit the sorted set of a sliding_log or in_flight limit
// (unused for the others).
func (s *Store) Keys(p *core.Policy, key string) []string {
	keys := make([]string, 1+len(p.Limits()))
	keys[0] = s.stateKey(p, key)
	for i := range p.Limits() {
		keys[1+i] = keyname.Limit(keys[0], p, i)
	}
	return keys
}

// decisionKeys is the part of Keys a decision's script reads
// (keyname.Decision).
func (s *Store) decisionKeys(p *core.Policy, key string) []string {
	var k keyname.Decision
	k.Set(s.prefix, p, key)
	return k.Strings()
}

// LocalDenials returns how many decisions the deny cache answered without
// Redis.
func (s *Store) LocalDenials() int64 {
	if s.denies == nil {
		return 0
	}
	return s.denies.Hits()
}

// Decide applies p to key in one round trip, or none when the deny cache
// holds the key's states and the step functions deny the request on them.
func (s *Store) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	var localNow, epoch int64
	if s.denies != nil {
		localNow = s.local.NowMicros()
		if s.denies.Lookup(p, key, cost, localNow, d) {
			return nil
		}
		epoch = s.denies.Epoch()
	}
	states, err := s.decide(ctx, p, key, cost, d)
	if err != nil {
		return err
	}
	if s.denies != nil && p.StoreSide().ChargesAfterResponse() {
		// The states held counted less than Redis now does; as after a
		// reset, a denial decided before the charge is not held either.
		s.denies.Forget(p, key)
	}
	if s.denies != nil && states != nil {
		s.denies.Remember(p, key, localNow, epoch, d, states)
	}
	return nil
}

// decide runs the script and fills d. On a denial it also returns the
// limits' states as Redis holds them (nil when a sliding log holds too many
// times to send).
func (s *Store) decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) ([]algo.State, error) {
	now := s.now()
	var reply []int64
	var err error
	if s.batch != nil {
		c := s.batch.newCall(p, cost, now)
		c.keys.Set(s.prefix, p, key)
		reply, err = s.batch.do(ctx, c) // within s.timeout
	} else {
		// The deadline bounds the whole decision, loading the code included.
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		reply, err = s.decider.run(ctx, s.client, s.decisionKeys(p, key), stepArgs(p, now, cost)).Int64Slice()
	}
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return fill(p, cost, reply, d)
}

// fill reads the script's reply to one request into d, and on a denial
// returns the limits' states it carries.
func fill(p *core.Policy, cost int64, reply []int64, d *core.Decision) ([]algo.State, error) {
	limits := p.Limits()
	if len(reply) < 1+5*len(limits) {
		return nil, fmt.Errorf("redis: script answered %d values, want at least %d", len(reply), 1+5*len(limits))
	}
	d.Start(p, max(cost, 0)) // -1: a probe (Inspect)
	d.At = reply[0]
	allowed := true
	for i := range limits {
		v := reply[1+5*i:]
		d.Results[i] = algo.Result{
			Allowed:    v[0] == 1,
			Quota:      limits[i].Count,
			Remaining:  v[1],
			Reset:      time.Duration(v[2]) * time.Microsecond,
			RetryAfter: time.Duration(v[3]) * time.Microsecond,
			Delay:      time.Duration(v[4]) * time.Microsecond,
		}
		allowed = allowed && v[0] == 1
	}
	d.Summarize(allowed)
	if allowed {
		return nil, nil
	}
	return parseStates(limits, reply[1+5*len(limits):])
}

// now is the time a script decides at: the injected clock's, or -1 for
// the server's TIME.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock.NowMicros()
	}
	return -1
}

// DecideCommand returns the keys and arguments of the call (FCALL of
// DecideFunction, or EVALSHA of DecideLua) that decides a request of cost units for key under p (cost
// -1: a probe that changes nothing), as Decide sends it alone: for tools
// that replay the store's work (the benchmark's pipelined ceiling).
func (s *Store) DecideCommand(p *core.Policy, key string, cost int64) (keys []string, args []any) {
	return s.decisionKeys(p, key), stepArgs(p, s.now(), cost)
}

// stepArgs is the arguments of DecideLua for one request.
func stepArgs(p *core.Policy, now, cost int64) []any {
	args := make([]any, 0, 4+7*len(p.Limits()))
	args = append(args, now, cost, len(p.Limits()), ttlMillis(p))
	return appendLimits(args, p)
}

// ttlMillis is how long, in ms, the script keeps an idle key of p's.
func ttlMillis(p *core.Policy) int64 { return (p.StoreSide().IdleMicros()+999)/1000 + 1 }

// appendLimits appends p's limits as DecideLua reads them, 7 values
// each, the first the algorithm and how p treats the limit (its
// core.LimitMode, times 16).
func appendLimits(args []any, p *core.Policy) []any {
	for i := range p.Limits() {
		l := &p.Limits()[i]
		args = append(args, int(l.Algorithm)+16*int(p.StoreSide().LimitMode(i)), l.Count, int64(l.Window/time.Microsecond),
			l.EffectiveBurst(), int64(l.MaxDelay/time.Microsecond), l.CalendarMonths(), p.StoreSide().LimitID(i))
	}
	return args
}

// Inspect fills d with what a request of cost 0 for key would see under p,
// in one round trip that writes nothing (core.Operator).
func (s *Store) Inspect(ctx context.Context, p *core.Policy, key string, d *core.Decision) error {
	_, err := s.decide(ctx, p, key, -1, d)
	return err
}

// Reset forgets key's state under p, every limit's or one limit's, in one
// MULTI (the limits' hash fields and sorted sets): atomic with concurrent
// decisions (core.Operator). This node's deny cache forgets the
// key too; another node's may answer a denial it holds until that
// denial's Retry-After.
func (s *Store) Reset(ctx context.Context, p *core.Policy, key string, limit int) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// Only p's limits are forgotten: another policy of the name (the
	// config a reload replaced) keeps the fields of limits p does not have.
	keys := s.Keys(p, key)
	var fields, sets []string
	for i := range p.Limits() {
		if limit == core.AllLimits || i == limit {
			id := p.StoreSide().LimitID(i)
			fields = append(fields, id, "seq:"+id)
			sets = append(sets, keys[1+i])
		}
	}
	_, err := s.client.TxPipelined(ctx, func(tx goredis.Pipeliner) error {
		tx.HDel(ctx, keys[0], fields...)
		tx.Del(ctx, sets...)
		return nil
	})
	if s.denies != nil {
		s.denies.Forget(p, key) // after the DEL: see forget
	}
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// CancelShaped gives back the places a shaped request took, in one round
// trip (core.ShapeStore): the cancel script (lua/cancel.lua) on the key's state hash, at
// Redis TIME. The deny cache forgets the key: a place came free.
func (s *Store) CancelShaped(ctx context.Context, sh *core.Shaped) error {
	p := sh.Policy
	now := int64(-1)
	if s.clock != nil {
		now = s.clock.NowMicros()
	}
	args := []any{now, sh.Cost}
	for i, l := range p.Limits() {
		if sh.Delays[i] > 0 {
			args = append(args, p.StoreSide().LimitID(i), l.Window.Microseconds(), l.Count, sh.At+sh.Delays[i])
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := cancelScript.Run(ctx, s.client, []string{s.stateKey(p, sh.Key)}, args...).Err()
	if s.denies != nil {
		s.denies.Forget(p, sh.Key)
	}
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// EndLease ends or renews a lease a decision of this store took, in one
// round trip (core.LeaseStore): the lease script (lua/lease.lua) over the policy's in_flight
// limits' sorted sets, at Redis's TIME.
func (s *Store) EndLease(ctx context.Context, l *core.Lease, renew bool) (found, now int64, err error) {
	p := l.Policy
	keys := s.Keys(p, l.Key)
	now = -1
	if s.clock != nil {
		now = s.clock.NowMicros()
	}
	args := []any{now, l.Token, l.Cost, 0, (p.StoreSide().IdleMicros()+999)/1000 + 1}
	if renew {
		args[3] = 1
	}
	var leaseKeys []string
	for i, lim := range p.Limits() {
		if lim.Algorithm == algo.InFlight {
			leaseKeys = append(leaseKeys, keys[1+i])
			args = append(args, int64(lim.Window/time.Microsecond))
		}
	}
	if len(leaseKeys) == 0 {
		return 0, now, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	reply, err := leaseScript.Run(ctx, s.client, leaseKeys, args...).Int64Slice()
	if err != nil {
		return 0, now, fmt.Errorf("redis: %w", err)
	}
	if len(reply) != 1+len(leaseKeys) {
		return 0, now, fmt.Errorf("redis: lease script answered %d values, want %d", len(reply), 1+len(leaseKeys))
	}
	return reply[1], reply[0], nil
}

// parseStates reads the states a denial's reply carries (see DecideLua);
// nil if a sliding log was too long to send.
func parseStates(limits []algo.Limit, v []int64) ([]algo.State, error) {
	states := make([]algo.State, len(limits))
	for i := range limits {
		if a := limits[i].Algorithm; a == algo.SlidingLog || a == algo.InFlight {
			if len(v) < 1 {
				return nil, errShortReply
			}
			k := v[0]
			if k < 0 {
				return nil, nil
			}
			if int64(len(v)) < 1+k {
				return nil, errShortReply
			}
			states[i] = algo.State{B: k, Log: &algo.Ring{Times: append([]int64(nil), v[1:1+k]...)}}
			v = v[1+k:]
			continue
		}
		if len(v) < 3 {
			return nil, errShortReply
		}
		states[i] = algo.State{A: v[0], B: v[1], C: v[2]}
		v = v[3:]
	}
	return states, nil
}

var errShortReply = errors.New("redis: script's reply ends early")

// stateKey names the hash of key's state under p.
func (s *Store) stateKey(p *core.Policy, key string) string { return keyname.State(s.prefix, p, key) }

// AddCounts adds each count to its window's shared count and reads the
// fleet's totals back, in one pipeline (eventual mode's sync) of count.lua
// calls, each taking up to countsPerCall windows (on a Cluster, those of
// one key, which share a hash slot). Window counts live beside the key's
// state, in its hash slot, and expire as each count's Keep and KeepNew say.
func (s *Store) AddCounts(ctx context.Context, counts []core.SharedCount) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	calls := s.countCalls(counts)
	s.pushCounts(ctx, counts, calls, false)
	if slices.ContainsFunc(calls, func(c countCall) bool { return isNoScript(c.cmd.Err()) }) {
		// A server that lost its scripts (a restart, a failover, a Cluster
		// node that never had it): send the script itself, only for the
		// calls it refused (each a script: all of it ran, or none), so no
		// count is added twice.
		s.pushCounts(ctx, counts, calls, true)
	}
	for _, c := range calls {
		totals, err := c.cmd.Int64Slice()
		if err == nil && len(totals) != c.to-c.from {
			err = fmt.Errorf("count script answered %d counts for %d windows", len(totals), c.to-c.from)
		}
		if err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		for i, total := range totals {
			counts[c.from+i].Total = total
		}
	}
	return nil
}

// countsPerCall bounds the windows one count.lua call takes, so one sync
// holds Redis (which runs a script alone) for a bounded time.
const countsPerCall = 256

// countCall is one count.lua call: counts[from:to], and its command once
// sent.
type countCall struct {
	from, to int
	cmd      *goredis.Cmd
}

// countCalls splits counts into count.lua calls: runs of up to
// countsPerCall, and on a Cluster runs of one key's windows.
func (s *Store) countCalls(counts []core.SharedCount) []countCall {
	_, cluster := s.client.(*goredis.ClusterClient)
	var calls []countCall
	for from := 0; from < len(counts); {
		to := from + 1
		for to < len(counts) && to-from < countsPerCall &&
			(!cluster || counts[to].Policy == counts[from].Policy && counts[to].Key == counts[from].Key) {
			to++
		}
		calls = append(calls, countCall{from: from, to: to})
		from = to
	}
	return calls
}

// pushCounts sends, in one pipeline, each call not sent yet or refused for
// want of the script, and sets its command: by the script's digest
// (EVALSHA), or with the whole script (EVAL, which also gives the server
// the script for the next sync).
func (s *Store) pushCounts(ctx context.Context, counts []core.SharedCount, calls []countCall, whole bool) {
	_, _ = s.client.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		for i := range calls {
			c := &calls[i]
			if c.cmd != nil && !isNoScript(c.cmd.Err()) {
				continue
			}
			keys, args := make([]string, 0, c.to-c.from), make([]any, 0, 3*(c.to-c.from))
			for j := c.from; j < c.to; j++ {
				w := &counts[j]
				keys = append(keys, s.countKey(w))
				args = append(args, w.Add, w.Keep.Milliseconds(), w.KeepNew.Milliseconds())
			}
			if whole {
				c.cmd = countScript.Eval(ctx, pipe, keys, args...)
			} else {
				c.cmd = countScript.EvalSha(ctx, pipe, keys, args...)
			}
		}
		return nil
	})
}

// DeleteCounts forgets each count's window (core.CountStore), in one
// pipeline.
func (s *Store) DeleteCounts(ctx context.Context, counts []core.SharedCount) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.client.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		for _, c := range counts {
			pipe.Del(ctx, s.countKey(&c))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// countKey names the shared count of c's window.
func (s *Store) countKey(c *core.SharedCount) string {
	return keyname.Limit(s.stateKey(c.Policy, c.Key), c.Policy, c.Limit) + ":" + strconv.FormatInt(c.Start, 10)
}

var _ core.Store = (*Store)(nil)

// Ping checks, within the store's timeout, that Redis answers (every
// node, for a Cluster) and decides: a server that answers PING but fails
// scripts (out of memory, scripts refused to this user, a proxy that drops
// FCALL and EVALSHA) would close a breaker only for the next decision to open it
// again, so the probe also runs a decision that writes nothing and checks
// its reply.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if c, ok := s.prober.(*goredis.ClusterClient); ok {
		if err := c.ForEachShard(ctx, func(ctx context.Context, n *goredis.Client) error { return n.Ping(ctx).Err() }); err != nil {
			return err
		}
	} else if err := s.prober.Ping(ctx).Err(); err != nil {
		return err
	}
	reply, err := s.decider.run(ctx, s.prober, s.decisionKeys(probePolicy, "probe"), stepArgs(probePolicy, s.now(), -1)).Int64Slice()
	if err != nil {
		return fmt.Errorf("redis: answers PING but cannot decide: %w", err)
	}
	var d core.Decision
	if _, err := fill(probePolicy, -1, reply, &d); err != nil {
		return fmt.Errorf("redis: answers PING but cannot decide: %w", err)
	}
	return nil
}

// probePolicy is what Ping decides on (as a probe: nothing is written).
var probePolicy = core.MustPolicy("tollgate-probe", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second, Algorithm: algo.FixedWindow})
