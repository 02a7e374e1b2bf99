package kongplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/pgtest"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/kongplugin/internal/kongdb"
)

// TestKongDatabase reads Kong's database from a .kong_env as Kong 3.9.3
// writes it (kong/cmd/utils/prefix_handler.lua; booleans as true and
// false, vault references left as written), with Kong's defaults for what
// it leaves out (kong/templates/kong_defaults.lua), and refuses a Kong
// without a database in words that say why.
func TestKongDatabase(t *testing.T) {
	prefix := func(body string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ".kong_env"), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	c, err := kongDatabase(prefix("database = postgres\npg_host = db.internal\npg_port = 6432\npg_user = kong\npg_password = foo\\#bar\npg_database = kong\npg_schema = kong_ns\npg_ssl = false\npg_timeout = 1500\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (kongdb.Conn{Host: "db.internal", Port: 6432, User: "kong", Password: "foo#bar", Database: "kong", Schema: "kong_ns", Timeout: 1500e6}); c != want {
		t.Errorf("Kong's database: %+v, want %+v", c, want)
	}
	if c, err = kongDatabase(prefix("role = traditional\n")); err != nil || c.Host != "127.0.0.1" || c.Port != 5432 || c.Database != "kong" || c.User != "kong" {
		t.Errorf("Kong's defaults: %+v %v", c, err)
	}
	for body, want := range map[string]string{
		"database = off\n":                         "this Kong has none (database = off in ",
		"database = postgres\nrole = data_plane\n": "not available to a hybrid data plane (role = data_plane in ",
		"pg_password = {vault://env/pg-pass}\n":    "pg_password is a vault reference ({vault://env/pg-pass}), which only Kong resolves",
		"pg_port = five\n":                         `pg_port = "five" in `,
	} {
		if _, err := kongDatabase(prefix(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	if _, err := kongDatabase(t.TempDir()); err == nil || !strings.Contains(err.Error(), ".kong_env, where Kong writes its settings, is missing") {
		t.Errorf("no .kong_env: %v", err)
	}
}

// TestDumpForKongWithoutDatabase: the dump for a DB-less Kong, a hybrid
// node, leaves policy cluster out of both plugins' schemas; for a Kong on
// Postgres it keeps it.
func TestDumpForKongWithoutDatabase(t *testing.T) {
	for _, v := range []Variant{AccessOnly, WithResponse} {
		for body, cluster := range map[string]bool{"database = off\n": false, "role = control_plane\ndatabase = postgres\n": false, "database = postgres\n": true} {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, ".kong_env"), []byte(body), 0o640); err != nil {
				t.Fatal(err)
			}
			s, err := forKong(schemas[v], dblessSchemas[v])(dir)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Check(object(t, `{"minute": 5, "policy": "cluster"}`))
			if got := err == nil; got != cluster {
				t.Errorf("variant %d, %q: cluster taken %v, want %v (%v)", v, body, got, cluster, err)
			}
		}
	}
}

// TestCheckKongDatabase: `check` reaches Kong's database as policy
// cluster does, from Kong's settings, and says so, or says what failed
// and where to look.
func TestCheckKongDatabase(t *testing.T) {
	db := pgtest.Start(t)
	prefix := func(port int) string {
		dir := t.TempDir()
		env := fmt.Sprintf("database = postgres\npg_host = 127.0.0.1\npg_port = %d\npg_user = kong\npg_database = kong\npg_timeout = 2000\n", port)
		if err := os.WriteFile(filepath.Join(dir, ".kong_env"), []byte(env), 0o640); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	lines := checkKongDatabase(prefix(db.Port))
	if len(lines) != 1 || !lines[0].OK || lines[0].Text != fmt.Sprintf("Kong's database at 127.0.0.1:%d answers (policy cluster)", db.Port) {
		t.Errorf("a database that answers: %v", lines)
	}
	closed, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	lines = checkKongDatabase(prefix(closed))
	if len(lines) != 1 || lines[0].OK || !strings.Contains(lines[0].Text, fmt.Sprintf("Kong's database at 127.0.0.1:%d (policy cluster): ", closed)) ||
		!strings.Contains(lines[0].Fix, "is Postgres up there, and does it take user kong from this host?") {
		t.Errorf("a database that does not answer: %v", lines)
	}
	dbless := t.TempDir()
	if err := os.WriteFile(filepath.Join(dbless, ".kong_env"), []byte("database = off\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if lines = checkKongDatabase(dbless); len(lines) != 1 || !lines[0].OK || !strings.Contains(lines[0].Text, "policy cluster is not offered") {
		t.Errorf("DB-less: %v", lines)
	}
}

// TestCheckPluginStore: `check -plugin FILE` reaches the Redis a plugin's
// config runs on, and says what failed when it does not answer.
func TestCheckPluginStore(t *testing.T) {
	rds := redistest.StartT(t)
	config := func(port int) []byte {
		return []byte(fmt.Sprintf(`{"minute": 5, "policy": "redis", "redis": {"host": "127.0.0.1", "port": %d, "timeout": 500}}`, port))
	}
	if l := checkPluginStore("", config(rds.Port), AccessOnly.KeysTarget); !l.OK || l.Text != fmt.Sprintf("the plugin's Redis at 127.0.0.1:%d answers", rds.Port) {
		t.Errorf("Redis up: %v", l)
	}
	closed, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if l := checkPluginStore("", config(closed), AccessOnly.KeysTarget); l.OK || !strings.Contains(l.Text, fmt.Sprintf("the plugin's Redis at 127.0.0.1:%d: ", closed)) || !strings.Contains(l.Fix, "is Redis up there") {
		t.Errorf("Redis down: %v", l)
	}
	if l := checkPluginStore("", []byte(`{"minute": 5}`), AccessOnly.KeysTarget); !l.OK || !strings.Contains(l.Text, "no Redis to reach") {
		t.Errorf("policy local: %v", l)
	}
	if l := checkPluginStore("", []byte(`{"minute": 0}`), AccessOnly.KeysTarget); l.OK || !strings.Contains(l.Text, "the plugin's config: ") {
		t.Errorf("a config refused: %v", l)
	}
}
