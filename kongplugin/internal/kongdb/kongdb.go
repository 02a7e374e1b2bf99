// Package kongdb keeps the counters of Kong's `cluster` policy where Kong
// keeps its own: in Kong's Postgres, one row per identifier, period and
// period start in Kong's table (ratelimiting_metrics for rate-limiting,
// response_ratelimiting_metrics for response-ratelimiting), keyed by the
// plugin's service and route as Kong keys them
// (kong/plugins/rate-limiting/policies/cluster.lua and policies/init.lua,
// get_service_and_route_ids). A user switching from Kong's plugin keeps
// the counts, and Kong's plugin sees tollgate's.
//
// It is a store like the others: a decision runs the policy's step
// functions (core.StoreSide.Apply) on the rows it locks, in one transaction,
// so every node of a fleet shares one exact count. It takes fixed windows
// only, the one algorithm a row's count can hold.
package kongdb

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// Table is Kong's table of one plugin's counters.
type Table struct {
	// Name is the table: ratelimiting_metrics or response_ratelimiting_metrics.
	Name string
	// TTL says the rows have Kong's ttl column (rate-limiting's): the time
	// Kong's trigger may delete a row after.
	TTL bool
	// ByPolicy names a row's period after its policy too, as
	// response-ratelimiting names it after its resource:
	// "<resource>_<period>".
	ByPolicy bool
}

// Kong's tables (kong/plugins/rate-limiting/migrations and
// kong/plugins/response-ratelimiting/migrations).
var (
	RateLimiting         = Table{Name: "ratelimiting_metrics", TTL: true}
	ResponseRateLimiting = Table{Name: "response_ratelimiting_metrics", ByPolicy: true}
)

// emptyUUID is what Kong stores for a plugin with no service or route.
const emptyUUID = "00000000-0000-0000-0000-000000000000"

// Options configures a Store.
type Options struct {
	// Conn is how to reach Kong's database.
	Conn Conn
	// Table is the plugin's table.
	Table Table
	// ServiceID and RouteID are the plugin's service and route ("" for
	// none): Kong's rows are keyed by them.
	ServiceID, RouteID string
	// Prefix is what the plugin puts before every identifier in a key (its
	// scope): a row's identifier is the key without it, as Kong's.
	Prefix string
	// Clock tells the time; nil means core.MonotonicClock. Kong's periods
	// start on its node's clock too (ngx.now).
	Clock core.Clock
}

// Store decides fixed-window limits on Kong's rows.
type Store struct {
	pool    *sharedPool
	opts    Options
	clock   core.Clock
	service string
	route   string
	timeout time.Duration // bounds a decision, as Kong's pg_timeout bounds its queries
	closed  sync.Once
	// The statements, with the table's name quoted in.
	insert, lock, read, update, remove string
}

// New opens a Store on the pool of o.Conn, shared by every Store of that
// connection in the process.
func New(o Options) (*Store, error) {
	if o.Table.Name == "" {
		return nil, errors.New("kongdb: no table")
	}
	pool, err := acquirePool(o.Conn)
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, opts: o, clock: o.Clock, service: cmpOr(o.ServiceID, emptyUUID), route: cmpOr(o.RouteID, emptyUUID)}
	if s.clock == nil {
		s.clock = core.NewMonotonicClock()
	}
	if s.timeout = o.Conn.Timeout; s.timeout <= 0 {
		s.timeout = 5 * time.Second
	}
	t := pgx.Identifier{o.Table.Name}.Sanitize()
	key := `"identifier" = $1 AND "period" = $2 AND "period_date" = to_timestamp($3) AND "service_id" = $4 AND "route_id" = $5`
	if o.Table.TTL {
		// As Kong's increment: a new row lives for its period's length.
		s.insert = `INSERT INTO ` + t + ` ("identifier", "period", "period_date", "service_id", "route_id", "value", "ttl")
			VALUES ($1, $2, to_timestamp($3), $4, $5, 0, now() + make_interval(secs => $6)) ON CONFLICT DO NOTHING`
	} else {
		s.insert = `INSERT INTO ` + t + ` ("identifier", "period", "period_date", "service_id", "route_id", "value")
			VALUES ($1, $2, to_timestamp($3), $4, $5, 0) ON CONFLICT DO NOTHING`
	}
	s.lock = `SELECT "value" FROM ` + t + ` WHERE ` + key + ` FOR UPDATE`
	s.read = `SELECT "value" FROM ` + t + ` WHERE ` + key
	s.update = `UPDATE ` + t + ` SET "value" = COALESCE("value", 0) + $6 WHERE ` + key
	s.remove = `DELETE FROM ` + t + ` WHERE "identifier" = $1 AND "period" = ANY($2) AND "service_id" = $3 AND "route_id" = $4`
	return s, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Close gives the Store's share of its pool back; the pool closes with
// its last Store.
func (s *Store) Close() error {
	s.closed.Do(s.pool.release)
	return nil
}

// Ping asks Kong's database whether it answers (failover.Pinger).
func (s *Store) Ping(ctx context.Context) error { return s.pool.pool.Ping(ctx) }

// row is one limit's row of a decision.
type row struct {
	period     string
	start, len int64 // the window's start and length, µs
	value      int64
}

// rows returns the rows of key's limits under p at now.
func (s *Store) rows(p *core.Policy, now int64) ([]row, error) {
	limits := p.Limits()
	rows := make([]row, len(limits))
	for i := range limits {
		l := &limits[i]
		if l.Algorithm != algo.FixedWindow {
			return nil, fmt.Errorf("policy %q limit %d (%s): Kong's database keeps one count per period, so it takes fixed_window only, not %s", p.Name(), i+1, l.Rate(), l.Algorithm)
		}
		start, end := l.FixedWindowAt(now)
		period := l.Name
		if period == "" {
			period = p.StoreSide().LimitID(i) // a limit of its own window: its identity
		}
		if s.opts.Table.ByPolicy {
			period = p.Name() + "_" + period
		}
		rows[i] = row{period: period, start: start, len: end - start}
	}
	return rows, nil
}

// args are a row's key arguments: identifier, period, period start (s),
// service, route.
func (s *Store) args(id string, r *row) []any {
	return []any{id, r.period, float64(r.start) / 1e6, s.service, s.route} // µs: Kong's periods start on whole seconds
}

// identifier is key without the plugin's prefix: Kong's identifier.
func (s *Store) identifier(key string) string { return strings.TrimPrefix(key, s.opts.Prefix) }

// Decide locks key's rows of p's limits, runs p's step functions on their
// counts and adds what they counted, in one transaction: two round trips.
func (s *Store) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	return s.withRows(ctx, p, key, func(ctx context.Context, v *visit) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		for i := range v.rows {
			a := s.args(v.id, &v.rows[i])
			if s.opts.Table.TTL {
				a = append(a, float64(v.rows[i].len)/1e6)
			}
			b.Queue(s.insert, a...)
		}
		for i := range v.rows {
			b.Queue(s.lock, s.args(v.id, &v.rows[i])...)
		}
		if err := s.readBatch(ctx, v.conn, b, v.rows, 1+len(v.rows)); err != nil {
			s.abort(v.conn)
			return err
		}
		states := apply(p, v.rows, v.now, cost, d)
		b = &pgx.Batch{}
		for i := range v.rows {
			if delta := states[i].B - v.rows[i].value; delta != 0 {
				b.Queue(s.update, append(s.args(v.id, &v.rows[i]), delta)...)
			}
		}
		b.Queue("COMMIT")
		if err := v.conn.SendBatch(ctx, b).Close(); err != nil {
			s.abort(v.conn)
			return fmt.Errorf("kong database: %w", err)
		}
		return nil
	})
}

// visit is what a decision or an inspection works on: the time, key's
// identifier, the rows of the policy's limits and a connection.
type visit struct {
	now  int64
	id   string
	rows []row
	conn *pgxpool.Conn
}

// withRows runs f on key's rows of p's limits, within s's timeout, on a
// connection it gives back after.
func (s *Store) withRows(ctx context.Context, p *core.Policy, key string, f func(context.Context, *visit) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v := visit{now: s.clock.NowMicros(), id: s.identifier(key)}
	var err error
	if v.rows, err = s.rows(p, v.now); err != nil {
		return err
	}
	if v.conn, err = s.pool.pool.Acquire(ctx); err != nil {
		return fmt.Errorf("kong database: %w", err)
	}
	defer v.conn.Release()
	return f(ctx, &v)
}

// apply runs p's step functions (StoreSide.Apply) on the rows' counts in
// their windows and returns the states they leave.
func apply(p *core.Policy, rows []row, now, cost int64, d *core.Decision) [core.MaxLimits]algo.State {
	var states [core.MaxLimits]algo.State
	for i := range rows {
		states[i] = algo.State{A: rows[i].start, B: rows[i].value}
	}
	p.StoreSide().Apply(states[:len(rows)], now, cost, d)
	return states
}

// readBatch sends b, whose first skip statements return no rows and whose
// others each read one row's value into rows, in order.
func (s *Store) readBatch(ctx context.Context, conn *pgxpool.Conn, b *pgx.Batch, rows []row, skip int) error {
	br := conn.SendBatch(ctx, b)
	for i := 0; i < skip; i++ {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("kong database: %w", err)
		}
	}
	for i := range rows {
		var v *int64
		if err := br.QueryRow().Scan(&v); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			_ = br.Close()
			return fmt.Errorf("kong database: %w", err)
		}
		rows[i].value = 0
		if v != nil && *v > 0 { // as Kong reads a row: a count above 0, or none
			rows[i].value = *v
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("kong database: %w", err)
	}
	return nil
}

// abort ends a transaction a failure left open, or the connection.
func (s *Store) abort(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx) // the pool drops a closed connection
	}
}

// Inspect fills d with what a request of cost 0 for key would see under p
// now, changing nothing (core.Operator): one round trip.
func (s *Store) Inspect(ctx context.Context, p *core.Policy, key string, d *core.Decision) error {
	return s.withRows(ctx, p, key, func(ctx context.Context, v *visit) error {
		b := &pgx.Batch{}
		for i := range v.rows {
			b.Queue(s.read, s.args(v.id, &v.rows[i])...)
		}
		if err := s.readBatch(ctx, v.conn, b, v.rows, 0); err != nil {
			return err
		}
		apply(p, v.rows, v.now, 0, d)
		return nil
	})
}

// Reset deletes key's rows of limit (an index of p's limits, or
// core.AllLimits), every period start (core.Operator): one statement,
// atomic with concurrent decisions, which wait on the rows' locks.
func (s *Store) Reset(ctx context.Context, p *core.Policy, key string, limit int) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.rows(p, s.clock.NowMicros())
	if err != nil {
		return err
	}
	var periods []string
	for i := range rows {
		if limit == core.AllLimits || limit == i {
			periods = append(periods, rows[i].period)
		}
	}
	if _, err := s.pool.pool.Exec(ctx, s.remove, s.identifier(key), periods, s.service, s.route); err != nil {
		return fmt.Errorf("kong database: %w", err)
	}
	return nil
}
