package caddyproc

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the caddyfile adapter
	_ "github.com/caddyserver/caddy/v2/modules/standard"          // what a stock Caddy serves with

	"github.com/tollgate/tollgate/internal/redistest"
)

// inProcess is held while a test runs Caddy in its own process: Caddy
// runs one config per process.
var inProcess sync.Mutex

// stopped is the config that stops an in-process Caddy.
const stopped = `{"admin": {"disabled": true, "config": {"persist": false}},
	"logging": {"logs": {"default": {"writer": {"output": "discard"}}}}}`

// StartInProcess runs Caddy in the test's own process (caddy.Load, as
// `caddy run` does after reading its config) serving a site with the
// given Caddyfile body, as Start does, and stops it when the test ends.
// The test's package must register the modules the body names (the
// tollgate handler registers itself when its package is linked). Real
// listeners serve the site and the admin API, so every method of Caddy
// but Pid, Kill and Goroutines works as on a process; a test that needs a
// process's life (its exit, its goroutines, two Caddies at once) uses
// Start. It costs no build and no process start: most behaviour tests
// use it. One runs at a time (a second call waits for the first's test
// to end, so a test calls it once); its Caddyfile (Caddyfile, Load) logs
// to the file LogTail reads, so a caddy command run on it logs there too.
func StartInProcess(t testing.TB, body string) *Caddy {
	t.Helper()
	return StartGlobalInProcess(t, "", body)
}

// StartGlobalInProcess is StartInProcess with extra global options.
func StartGlobalInProcess(t testing.TB, global, body string) *Caddy {
	t.Helper()
	inProcess.Lock()
	t.Cleanup(inProcess.Unlock) // runs last: after Caddy stopped
	ports, err := redistest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	port, admin := ports[0], ports[1]
	dir := t.TempDir()
	c := &Caddy{URL: "http://127.0.0.1:" + strconv.Itoa(port), Port: port,
		AdminURL: "http://127.0.0.1:" + strconv.Itoa(admin), dir: dir, log: filepath.Join(dir, "caddy.log"), t: t}
	// Caddy's log goes to the file a failed test shows, as a process's.
	c.global = "\tlog {\n\t\toutput file " + c.log + "\n\t}\n\tstorage file_system " + dir
	if global != "" {
		c.global += "\n" + global
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfg, _, err := adapter.Adapt([]byte(c.Caddyfile(body)), nil)
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v", err)
	}
	t.Cleanup(func() {
		// A config with the admin API disabled stops the site and the
		// admin server: nothing of this test serves the next. It is not
		// saved, and it logs nowhere.
		if err := caddy.Load([]byte(stopped), true); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
		if t.Failed() {
			t.Logf("caddy log (last 3000 bytes):\n%s", c.LogTail(3000))
		}
	})
	if err := caddy.Load(cfg, true); err != nil {
		b, _ := os.ReadFile(c.log)
		t.Fatalf("caddy refused the config: %v\n%s", err, b)
	}
	// caddy.Load returns once its listeners are bound.
	conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("caddy does not serve its site: %v", err)
	}
	conn.Close()
	return c
}
