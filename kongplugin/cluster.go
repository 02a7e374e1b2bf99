package kongplugin

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/openstore"
	"github.com/tollgate/tollgate/kongplugin/internal/kongcheck"
	"github.com/tollgate/tollgate/kongplugin/internal/kongdb"
	"github.com/tollgate/tollgate/kongplugin/internal/kongenv"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
)

// clusterScope is where an instance's counts go in Kong's database: its
// table, and the service and route Kong keys the rows by.
type clusterScope struct {
	table              kongdb.Table
	prefix             string // the instance's scope before each identifier
	serviceID, routeID string
}

// clusterStore is the store of policy cluster: Kong's own Postgres, as
// Kong's cluster policy keeps its counters there
// (kong/plugins/rate-limiting/policies/cluster.lua), reached with the
// pg_* settings Kong resolved in its prefix's .kong_env. fault_tolerant
// (or on_error) decides while the database fails, as with Redis.
func clusterStore(cs clusterScope, faultTolerant bool, onError string) (openstore.Config, error) {
	conn, err := kongDatabase(startingKong())
	if err != nil {
		return openstore.Config{}, err
	}
	oe, err := core.ParseOnError(failurePolicy(faultTolerant, onError))
	if err != nil {
		return openstore.Config{}, fmt.Errorf("on_error: %w", err)
	}
	o := kongdb.Options{Conn: conn, Table: cs.table, ServiceID: cs.serviceID, RouteID: cs.routeID, Prefix: cs.prefix}
	id, _ := json.Marshal(o)
	return openstore.Config{OnError: oe, External: &openstore.External{ID: string(id), Kind: "postgres", Open: func() (core.Store, func() error, error) {
		s, err := kongdb.New(o)
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}}}, nil
}

// kongDatabase reads the database Kong uses from <prefix>/.kong_env: the
// pg_* settings, with Kong's defaults for those it did not write
// (kong/templates/kong_defaults.lua), and Kong's TLS trust for pg_ssl.
// Kong without a database (DB-less, or a hybrid data plane) has no
// cluster policy, as Kong's own schema says (rate-limiting/schema.lua).
func kongDatabase(prefix string) (kongdb.Conn, error) {
	if prefix == "" {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster keeps counters in Kong's database, and no Kong prefix says which (-kong-prefix; the keys command's --kong-prefix)")
	}
	env, err := kongenv.Read(prefix)
	if err != nil {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster: %w", err)
	}
	if env == nil {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster keeps counters in Kong's database, and %w", &missingKongFile{filepath.Join(prefix, kongenv.File), "where Kong writes its settings"})
	}
	get := func(name, def string) string {
		v, _ := env.Get(name)
		return cmp.Or(v, def)
	}
	if db := get("database", "postgres"); db != "postgres" {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster keeps counters in Kong's database, and this Kong has none (database = %s in %s): use local or redis, as Kong's rate-limiting must", db, env.Path)
	}
	if role := get("role", "traditional"); role == "data_plane" || role == "control_plane" {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster is not available to a hybrid %s (role = %s in %s), as Kong's rate-limiting refuses it: use local or redis", strings.ReplaceAll(role, "_", " "), role, env.Path)
	}
	for _, name := range []string{"pg_host", "pg_port", "pg_user", "pg_password", "pg_database", "pg_schema"} {
		if v, _ := env.Get(name); strings.HasPrefix(v, "{vault://") {
			return kongdb.Conn{}, fmt.Errorf("policy: cluster: %s is a vault reference (%s), which only Kong resolves: give the plugin server's Kong the value itself, or use redis", name, v)
		}
	}
	port, err := env.Int("pg_port", 5432)
	if err != nil {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster: %w", err)
	}
	timeout, err := env.Int("pg_timeout", 5000)
	if err != nil {
		return kongdb.Conn{}, fmt.Errorf("policy: cluster: %w", err)
	}
	c := kongdb.Conn{Host: get("pg_host", "127.0.0.1"), Port: port, User: get("pg_user", "kong"), Database: get("pg_database", "kong"),
		Schema: get("pg_schema", ""), Timeout: time.Duration(timeout) * time.Millisecond}
	c.Password, _ = env.Get("pg_password")
	on := func(name string) bool { v := get(name, "false"); return v == "true" || v == "on" } // Kong writes a boolean as true or false
	c.SSL, c.SSLVerify = on("pg_ssl"), on("pg_ssl_verify")
	if c.SSL && c.SSLVerify {
		trust, err := readKongTrust(prefix)
		if err != nil {
			return kongdb.Conn{}, fmt.Errorf("policy: cluster: pg_ssl_verify: %w", err)
		}
		c.CAFile, c.MaxChain = trust.caFile, trust.maxChain
	}
	return c, nil
}

// checkCluster refuses what Kong's rows cannot hold: a window other than
// a fixed one (a row holds one count per period), and a namespace (rows
// are per service and route, as Kong's plugin keys them). Compile checks
// each plan's policy on its own.
func checkCluster(p *core.Policy, namespace string) error {
	if namespace != "" {
		return fmt.Errorf("namespace: %q shares counters across instances, and policy cluster keeps Kong's rows, one set per service and route, as Kong's rate-limiting", namespace)
	}
	for i, l := range p.Configured() {
		if l.Algorithm != algo.FixedWindow {
			return fmt.Errorf("algorithm: policy cluster keeps one count per period in Kong's database, as Kong's rate-limiting, so it takes fixed_window only, not %s (limit %d, %s)", l.Algorithm, i+1, l.Label())
		}
	}
	return nil
}

// withoutCluster is a declaration without policy cluster, as Kong's own
// plugins declare themselves on a Kong with no database (DB-less, or a
// hybrid control plane, whose data planes have none): Kong's Admin API and
// declarative config then refuse it, naming the field.
func withoutCluster(declaration []byte) []byte {
	out := bytes.Replace(declaration, []byte(`"one_of": ["local", "cluster", "redis"]`), []byte(`"one_of": ["local", "redis"]`), 1)
	if bytes.Equal(out, declaration) {
		panic("kongplugin: the declaration has no policy one_of to take cluster from") // compiled in: a test runs it
	}
	return out
}

// forKong returns the schema a Kong with prefix gets from -dump: without
// policy cluster when it has no database, as Kong's rate-limiting's
// schema.lua decides (is_dbless).
func forKong(full, dbless func() *kongschema.Schema) func(prefix string) (*kongschema.Schema, error) {
	return func(prefix string) (*kongschema.Schema, error) {
		env, err := kongenv.Read(prefix)
		if err != nil || env == nil {
			return full(), err
		}
		db, _ := env.Get("database")
		role, _ := env.Get("role")
		if db == "off" || role == "control_plane" || role == "data_plane" {
			return dbless(), nil
		}
		return full(), nil
	}
}

// checkKongDatabase is `check`'s look beyond the prefix's files: Kong's
// database, which policy cluster keeps its counters in, reached as an
// instance reaches it (Kong's pg_* settings, and its trust for pg_ssl).
func checkKongDatabase(prefix string) []kongcheck.Line {
	env, err := kongenv.Read(prefix)
	if err != nil || env == nil {
		return nil // the prefix's own checks said so
	}
	db, _ := env.Get("database")
	role, _ := env.Get("role")
	if db == "off" || role == "data_plane" || role == "control_plane" {
		return []kongcheck.Line{{OK: true, Text: "Kong has no database here (database = " + cmp.Or(db, "postgres") + ", role = " + cmp.Or(role, "traditional") + "): policy cluster is not offered"}}
	}
	conn, err := kongDatabase(prefix)
	if err != nil {
		return []kongcheck.Line{{Text: err.Error()}}
	}
	store, err := kongdb.New(kongdb.Options{Conn: conn, Table: kongdb.RateLimiting})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(conn.Timeout, 5*time.Second))
		err = store.Ping(ctx)
		cancel()
		_ = store.Close()
	}
	if err != nil {
		return []kongcheck.Line{{Text: "Kong's database at " + conn.Addr() + " (policy cluster): " + err.Error(),
			Fix: "the plugin server reaches Postgres with Kong's pg_* settings from " + env.Path + ": is Postgres up there, and does it take user " + conn.User + " from this host?"}}
	}
	return []kongcheck.Line{{OK: true, Text: "Kong's database at " + conn.Addr() + " answers (policy cluster)"}}
}
