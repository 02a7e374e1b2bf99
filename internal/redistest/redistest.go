// Package redistest starts real redis-server processes on free loopback
// ports for tests: a standalone server and a three-master Redis Cluster.
// The processes die with the test binary (Pdeathsig) and are stopped by
// Stop.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core/store/redis/acl"
)

// ACLTestPassword is the least-privilege user's password in the tests.
const ACLTestPassword = "tollgate-acl-test"

// Server is one running redis-server.
type Server struct {
	Addr string
	Port int
	Dir  string
	// User and Password, when set, are the least-privilege user
	// (core/store/redis/acl) the tests' stores connect as: see Main.
	User, Password string
	cmd            *exec.Cmd
	bin            string
	args           []string
}

// Binary returns the redis-server path, or an error that says how to get it.
func Binary() (string, error) {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH: install it (apt-get install -y redis-server) or run `make test`, which does")
	}
	return p, nil
}

// FreePort returns a loopback TCP port nobody listens on now.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct free loopback ports: all are held open
// until each is chosen, so two calls in a row cannot return one port twice
// (Caddy binds with SO_REUSEPORT, so a site and its admin API given one
// port would share it, each taking some of the other's requests).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// Start runs a redis-server with no persistence on a free port, plus extra
// arguments, and waits until it answers PING.
func Start(dir string, extra ...string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		sdir := filepath.Join(dir, "redis-"+strconv.Itoa(port))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return nil, err
		}
		args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", sdir, "--logfile", filepath.Join(sdir, "redis.log")}, extra...)
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: sdir, bin: bin, args: args}
		if lastErr = s.run(); lastErr == nil {
			return s, nil
		}
		s.Stop()
	}
	return nil, lastErr
}

func (s *Server) run() error {
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	return s.waitPing(5 * time.Second)
}

// Restart starts the stopped server again on the same port.
func (s *Server) Restart() error { return s.run() }

func (s *Server) waitPing(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		// A server with requirepass answers NOAUTH: it is up all the same.
		if out, err := s.Do("PING"); err == nil && (out == "+PONG" || strings.HasPrefix(out, "-NOAUTH")) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return fmt.Errorf("redis-server on %s did not answer PING: %s", s.Addr, log)
}

// Do sends one inline command and returns the first line of the reply.
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// ConnectedClients is how many client connections s has (INFO clients),
// besides the one asking.
func (s *Server) ConnectedClients() (int, error) {
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "clients").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			return n - 1, err
		}
	}
	return 0, fmt.Errorf("redis %s: INFO clients has no connected_clients", s.Addr)
}

// CommandsProcessed is how many commands s has processed (INFO stats,
// total_commands_processed), counting the INFO that asks, which it sends
// on a connection of its own with no handshake: no other command.
func (s *Server) CommandsProcessed() (int64, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil {
		return 0, fmt.Errorf("redis %s: INFO answered %q", s.Addr, head)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("redis %s: INFO stats has no total_commands_processed", s.Addr)
}

// CommandStats is what s's INFO commandstats says of command (lower
// case, "evalsha"): how many calls it ran and Redis's time in them, in µs
// (the command's execution, nested calls of a script included; not its
// network). Zero when s has not run it since it started or since CONFIG
// RESETSTAT.
func (s *Server) CommandStats(command string) (calls, usec int64, err error) {
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			name, v, _ := strings.Cut(field, "=")
			switch name {
			case "calls":
				calls, err = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil {
				return 0, 0, fmt.Errorf("redis %s: INFO commandstats: %q: %v", s.Addr, line, err)
			}
		}
	}
	return calls, usec, nil
}

// StartT starts a server for test t in its temporary directory and stops
// it when the test ends; it fails the test if the server does not start.
func StartT(t testing.TB) *Server {
	t.Helper()
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// KongRecord is the server as Kong's redis record names it: host and port
// apart.
func (s *Server) KongRecord() map[string]any {
	host, port, _ := strings.Cut(s.Addr, ":")
	n, _ := strconv.Atoi(port)
	return map[string]any{"host": host, "port": n}
}

// Stop kills the server and waits for it.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Signal sends sig to the server (SIGSTOP pauses it, SIGCONT resumes).
func (s *Server) Signal(sig os.Signal) error { return s.cmd.Process.Signal(sig) }

// Pid is the running redis-server's process id (benchmarks read its CPU
// time from /proc).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Cluster is a Redis Cluster of three masters, with or without replicas.
type Cluster struct {
	Nodes []*Server
	// User and Password: as Server's.
	User, Password string
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Addr)
	}
	return out
}

// StartCluster starts three cluster-enabled servers, joins them with
// redis-cli --cluster create, and waits until the cluster is ok.
func StartCluster(dir string) (*Cluster, error) { return startCluster(dir, 0, 2000) }

// StartClusterWithReplicas starts three masters with one replica each, and
// a short node timeout (ms) so a replica takes over a dead master quickly.
// MasterOf finds which node is a key's master.
func StartClusterWithReplicas(dir string, nodeTimeoutMS int) (*Cluster, error) {
	return startCluster(dir, 1, nodeTimeoutMS)
}

func startCluster(dir string, replicas, nodeTimeoutMS int, extra ...string) (*Cluster, error) {
	c := &Cluster{}
	for i := 0; i < 3*(1+replicas); i++ {
		s, err := Start(dir, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(nodeTimeoutMS)}, extra...)...)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli not found on PATH (it ships with redis-server): %w", err)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ok := 0
		for _, n := range c.Nodes {
			if out, err := exec.Command(cli, "-p", strconv.Itoa(n.Port), "cluster", "info").Output(); err == nil &&
				strings.Contains(string(out), "cluster_state:ok") {
				ok++
			}
		}
		if ok == len(c.Nodes) && (replicas == 0 || c.replicasSynced(cli)) {
			return c, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Stop()
	return nil, fmt.Errorf("redis cluster on %v did not reach cluster_state:ok", c.Addrs())
}

// replicasSynced reports whether every replica is connected to its master.
func (c *Cluster) replicasSynced(cli string) bool {
	for _, n := range c.Nodes {
		out, err := exec.Command(cli, "-p", strconv.Itoa(n.Port), "info", "replication").Output()
		if err != nil {
			return false
		}
		if strings.Contains(string(out), "role:slave") && !strings.Contains(string(out), "master_link_status:up") {
			return false
		}
	}
	return true
}

// MasterOf returns the node that serves key's slot as master.
func (c *Cluster) MasterOf(key string) (*Server, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		role, err := exec.Command(cli, "-p", strconv.Itoa(n.Port), "role").Output()
		if err != nil || !strings.HasPrefix(string(role), "master") {
			continue
		}
		slot, err := exec.Command(cli, "-p", strconv.Itoa(n.Port), "cluster", "keyslot", key).Output()
		if err != nil {
			return nil, err
		}
		s, _ := strconv.Atoi(strings.TrimSpace(string(slot)))
		nodes, err := exec.Command(cli, "-p", strconv.Itoa(n.Port), "cluster", "nodes").Output()
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				a, _ := strconv.Atoi(lo)
				b, _ := strconv.Atoi(hi)
				if s >= a && s <= b {
					addr, _, _ := strings.Cut(f[1], "@")
					for _, m := range c.Nodes {
						if m.Addr == addr {
							return m, nil
						}
					}
				}
			}
		}
		break
	}
	return nil, fmt.Errorf("no master found for %q", key)
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// StartSentinel starts a redis-sentinel (redis-server --sentinel) that
// monitors master under name, with a quorum of 1.
func StartSentinel(dir, name string, master *Server) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	sdir := filepath.Join(dir, "sentinel-"+strconv.Itoa(port))
	if err := os.MkdirAll(sdir, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(sdir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 2000\n",
		port, sdir, filepath.Join(sdir, "redis.log"), name, master.Port, name)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: sdir, bin: bin, args: []string{conf, "--sentinel"}}
	if err := s.run(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Main is a TestMain body for packages that test against real Redis: it
// starts a standalone server into *standalone and, if cluster is not nil, a
// three-master Cluster into *cluster, runs the tests and stops them. It
// returns the exit code; a missing redis-server fails the package.
//
// With TOLLGATE_REDIS_ACL set, the standalone server has a user with only
// what tollgate needs (acl.Rule) on keys starting "t" (every test prefix),
// and on the Cluster's nodes, and the tests' stores on them connect as
// that user (Server.User, Cluster.User).
func Main(m interface{ Run() int }, standalone **Server, cluster **Cluster) int {
	dir, err := os.MkdirTemp("", "tollgate-redis-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// With TOLLGATE_REDIS_ACL the suite runs as tollgate's least-privilege
	// user; the default user stays for the harness (readiness PINGs,
	// Sentinel, redis-cli --cluster create, replication).
	var user []string
	if os.Getenv("TOLLGATE_REDIS_ACL") != "" {
		user = append([]string{"--user", "tollgate"}, strings.Fields(acl.Rule(ACLTestPassword, "t"))...)
	}
	if *standalone, err = Start(dir, user...); err == nil && user != nil {
		(*standalone).User, (*standalone).Password = "tollgate", ACLTestPassword
	}
	if err == nil && cluster != nil {
		if *cluster, err = startCluster(dir, 0, 2000, user...); err == nil && user != nil {
			(*cluster).User, (*cluster).Password = "tollgate", ACLTestPassword
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "these tests need a real redis-server:", err)
		if *standalone != nil {
			(*standalone).Stop()
		}
		return 1
	}
	code := m.Run()
	(*standalone).Stop()
	if cluster != nil {
		(*cluster).Stop()
	}
	return code
}
