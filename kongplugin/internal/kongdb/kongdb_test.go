package kongdb

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/storetest"
	"github.com/tollgate/tollgate/internal/pgtest"
)

// kongTables are Kong 3.9.3's two tables as its migrations leave them
// (kong/plugins/rate-limiting/migrations: 000_base, 004_200_to_210's ttl;
// response-ratelimiting's 000_base), written here from their columns.
const kongTables = `
CREATE TABLE ratelimiting_metrics (
  identifier TEXT NOT NULL, period TEXT NOT NULL, period_date TIMESTAMP WITH TIME ZONE NOT NULL,
  service_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'::UUID,
  route_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'::UUID,
  value INTEGER, ttl TIMESTAMP WITH TIME ZONE,
  PRIMARY KEY (identifier, period, period_date, service_id, route_id));
CREATE TABLE response_ratelimiting_metrics (
  identifier TEXT NOT NULL, period TEXT NOT NULL, period_date TIMESTAMP WITH TIME ZONE NOT NULL,
  service_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'::UUID,
  route_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'::UUID,
  value INTEGER,
  PRIMARY KEY (identifier, period, period_date, service_id, route_id));`

// database is one Postgres for the package's tests; each store gets a
// schema of its own with Kong's tables (Kong's pg_schema).
type database struct {
	srv     *pgtest.Server
	schemas atomic.Int64
}

func startDatabase(t *testing.T) *database {
	return &database{srv: pgtest.Start(t)}
}

// conn returns a Conn to a new schema holding Kong's empty tables.
func (db *database) conn(t *testing.T) Conn {
	t.Helper()
	schema := fmt.Sprintf("s%d", db.schemas.Add(1))
	ctx := context.Background()
	c, err := pgx.Connect(ctx, db.srv.DSN("kong"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+schema+"; SET search_path = "+schema+";"+kongTables); err != nil {
		t.Fatal(err)
	}
	return Conn{Host: "127.0.0.1", Port: db.srv.Port, User: "kong", Database: "kong", Schema: schema}
}

func (db *database) store(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the conformance suite on Kong's tables, on fixed
// windows (every other algorithm is refused): golden traces and random
// ones against the reference model (responses charged after them and
// token budgets among them: tollgate-response on policy cluster), keys
// and limits in the rows Kong's cluster policy would use.
func TestConformance(t *testing.T) {
	db := startDatabase(t)
	for _, table := range []Table{RateLimiting, ResponseRateLimiting} {
		t.Run(table.Name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
				return db.store(t, Options{Conn: db.conn(t), Table: table, Clock: clock})
			}, storetest.Options{Algorithms: []algo.Algorithm{algo.FixedWindow}, Seeds: storetest.TokenSeed})
		})
	}
}

// TestKongsRows: a decision counts in the row Kong's cluster policy reads
// (identifier without the plugin's scope, Kong's period name, the
// period's start, service and route ids, Kong's nil UUID for none), and
// takes Kong's own count in it into account.
func TestKongsRows(t *testing.T) {
	db := startDatabase(t)
	conn := db.conn(t)
	clock := &core.ManualClock{Micros: storetest.T0 + 30_000_000} // 30 s into a minute
	const service = "5f4a1e2b-0000-4000-8000-000000000001"
	s := db.store(t, Options{Conn: conn, Table: RateLimiting, ServiceID: service, Prefix: "route=,service=" + service + "|", Clock: clock})
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Name: "minute", Count: 5, Window: time.Minute, Algorithm: algo.FixedWindow})
	ctx := context.Background()
	c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://kong@127.0.0.1:%d/kong?search_path=%s", conn.Port, conn.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// Kong's plugin counted 2 in this minute (its increment's INSERT).
	minute := (storetest.T0 / 1e6)
	if _, err := c.Exec(ctx, `INSERT INTO ratelimiting_metrics VALUES ('203.0.113.7', 'minute', to_timestamp($1), $2, $3, 2, now() + interval '60 second')`,
		float64(minute), service, emptyUUID); err != nil {
		t.Fatal(err)
	}
	var d core.Decision
	for i, want := range []int64{2, 1, 0} {
		if err := s.Decide(ctx, p, "route=,service="+service+"|203.0.113.7", 1, &d); err != nil || !d.Allowed || d.Remaining != want {
			t.Fatalf("request %d: %v allowed %v remaining %d, want %d left of Kong's count", i+1, err, d.Allowed, d.Remaining, want)
		}
	}
	if err := s.Decide(ctx, p, "route=,service="+service+"|203.0.113.7", 1, &d); err != nil || d.Allowed {
		t.Fatalf("the 6th request of the minute: %v allowed %v, want denied", err, d.Allowed)
	}
	var value int64
	var ttl time.Time
	if err := c.QueryRow(ctx, `SELECT value, ttl FROM ratelimiting_metrics WHERE identifier = '203.0.113.7' AND period = 'minute'
		AND period_date = to_timestamp($1) AND service_id = $2 AND route_id = $3`, float64(minute), service, emptyUUID).Scan(&value, &ttl); err != nil {
		t.Fatal(err)
	}
	if value != 5 {
		t.Errorf("Kong's row holds %d, want 5 (Kong's 2 and tollgate's 3; the denial counts nothing)", value)
	}
	// A response-ratelimiting resource: period "<resource>_<period>".
	rs := db.store(t, Options{Conn: conn, Table: ResponseRateLimiting, RouteID: service, Clock: clock})
	video := core.MustPolicy("video", core.PolicyOptions{}, algo.Limit{Name: "second", Count: 9, Window: time.Second, Algorithm: algo.FixedWindow})
	if err := rs.Decide(ctx, video, "k", 4, &d); err != nil || !d.Allowed {
		t.Fatal(err, d.Allowed)
	}
	if err := c.QueryRow(ctx, `SELECT value FROM response_ratelimiting_metrics WHERE identifier = 'k' AND period = 'video_second'
		AND service_id = $1 AND route_id = $2`, emptyUUID, service).Scan(&value); err != nil || value != 4 {
		t.Errorf("response-ratelimiting's row: %d %v, want 4 under video_second", value, err)
	}
}

// TestOnlyFixedWindows: every other algorithm is refused with the reason.
func TestOnlyFixedWindows(t *testing.T) {
	db := startDatabase(t)
	s := db.store(t, Options{Conn: db.conn(t), Table: RateLimiting})
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 5, Window: time.Minute, Algorithm: algo.SlidingLog})
	var d core.Decision
	err := s.Decide(context.Background(), p, "k", 1, &d)
	if err == nil || !strings.Contains(err.Error(), "Kong's database keeps one count per period, so it takes fixed_window only, not sliding_log") {
		t.Fatalf("a sliding log on Kong's database: %v", err)
	}
}

// TestConcurrentDecisionsAreExact: 8 clients at once on one key of a
// limit of 50 get exactly 50 through: the rows' locks serialize them.
func TestConcurrentDecisionsAreExact(t *testing.T) {
	db := startDatabase(t)
	conn := db.conn(t)
	conn.MaxConns = 8
	s := db.store(t, Options{Conn: conn, Table: RateLimiting})
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Name: "hour", Count: 50, Window: time.Hour, Algorithm: algo.FixedWindow},
		algo.Limit{Name: "day", Count: 1000, Window: 24 * time.Hour, Algorithm: algo.FixedWindow})
	var allowed atomic.Int64
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			var d core.Decision
			for range 10 {
				if err := s.Decide(context.Background(), p, "k", 1, &d); err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					allowed.Add(1)
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := allowed.Load(); n != 50 {
		t.Fatalf("%d of 80 concurrent requests allowed, want exactly 50", n)
	}
}
