package kongreal

import (
	"strconv"

	"github.com/tollgate/tollgate/internal/pgtest"
)

// Postgres is a PostgreSQL server of a test's own, for Kong's DB mode
// (pgtest.Server).
type Postgres = pgtest.Server

// StartPostgres starts a server for t and stops it when t ends.
func StartPostgres(t T) *Postgres { return pgtest.Start(t) }

// postgresConf are the kong.conf lines of DB mode on p.
func postgresConf(p *Postgres) []string {
	return []string{"database = postgres", "pg_host = 127.0.0.1", "pg_port = " + strconv.Itoa(p.Port), "pg_user = kong", "pg_database = kong"}
}
