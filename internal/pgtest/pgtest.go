// Package pgtest runs a PostgreSQL server of a test's own: Debian's
// postgresql (make test installs it), a cluster initdb makes in a
// temporary directory, trust auth for the role kong on 127.0.0.1, and a
// database kong.
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/redistest"
)

// T is what Start needs of a test (testing.TB has it).
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Server is a PostgreSQL server of a test's own:
// Debian's postgresql (make kong-test installs it), a cluster made by
// initdb in a temporary directory, trust auth for the role kong on
// 127.0.0.1, and a database kong.
type Server struct {
	Port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a server for t and stops it when t ends.
func Start(t T) *Server {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("PostgreSQL is missing: apt-get install postgresql (make test and make kong-test install it)")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	pg, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("the postgres user (Debian's postgresql makes it): %v", err)
	}
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	dir, err := os.MkdirTemp("", "kong-pg-") // initdb refuses to run as root: the server's user owns it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	asPostgres := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, Setpgid: true, Pdeathsig: syscall.SIGTERM}
		return cmd
	}
	data := filepath.Join(dir, "data")
	if out, err := asPostgres(exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "kong")).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &Server{Port: port, done: make(chan struct{})}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = asPostgres(exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", dir))
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); log.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGINT) // a fast shutdown
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			out, err := exec.Command(filepath.Join(bin, "psql"), "-X", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "kong", "-d", "postgres",
				"-c", "CREATE DATABASE kong").CombinedOutput()
			if err == nil {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("CREATE DATABASE kong: %v\n%s", err, out)
			}
		} else if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			t.Fatalf("postgres on port %d did not answer in 30 s:\n%s", port, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DSN is a connection string for the role kong to database db.
func (p *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://kong@127.0.0.1:%d/%s?sslmode=disable", p.Port, db)
}
