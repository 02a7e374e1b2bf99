package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/failover"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// lyingRedis is a TCP server on loopback that speaks enough RESP for
// go-redis to connect (it refuses HELLO, so the client speaks RESP2) and
// answers every script call with lie, the bytes as given.
type lyingRedis struct {
	ln       net.Listener
	lie      []byte
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
	commands map[string]int // received, by name
}

// count is how many commands named name the server has received.
func (l *lyingRedis) count(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.commands[name]
}

func startLyingRedis(t *testing.T, lie string) *lyingRedis {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &lyingRedis{ln: ln, lie: []byte(lie), commands: map[string]int{}}
	l.wg.Add(1)
	go l.accept()
	t.Cleanup(l.close)
	return l
}

func (l *lyingRedis) close() {
	l.ln.Close()
	l.mu.Lock()
	for _, c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *lyingRedis) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
		l.wg.Add(1)
		go l.serve(c)
	}
}

func (l *lyingRedis) serve(c net.Conn) {
	defer l.wg.Done()
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		name := strings.ToUpper(cmd[0])
		l.mu.Lock()
		l.commands[name]++
		l.mu.Unlock()
		var reply []byte
		switch name {
		case "HELLO":
			reply = []byte("-ERR unknown command 'HELLO'\r\n")
		case "PING":
			reply = []byte("+PONG\r\n")
		case "FCALL", "FCALL_RO", "EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO":
			reply = l.lie
		default: // CLIENT SETINFO, SELECT, SCRIPT LOAD...
			reply = []byte("+OK\r\n")
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// readCommand reads one client command: an array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 || n > 1<<20 {
		return nil, fmt.Errorf("not a command: %q", line)
	}
	args := make([]string, n)
	for i := range args {
		head, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
		if err != nil || size < 0 || size > 1<<24 {
			return nil, fmt.Errorf("not a bulk string: %q", head)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// TestLyingRedis: whatever a server sends in answer to a decision, the
// gateway neither panics, nor hangs past the store's timeout, nor allocates
// more than a decision can need: a reply that claims more than the bounds
// (package replybound) fails that decision with an error, before go-redis reads
// the claim, and the store's failure policy answers it.
func TestLyingRedis(t *testing.T) {
	policy := core.MustPolicy("lie", core.PolicyOptions{}, algo.Limit{Algorithm: algo.SlidingLog, Count: 3, Window: time.Minute},
		algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Window: time.Minute})
	huge := strconv.Itoa(1 << 31)
	for _, tc := range []struct{ name, lie, want string }{
		{"an array of 2^31 elements", "*2147483647\r\n", "elements"},
		{"a bulk string of 512 MiB", "$536870912\r\n" + strings.Repeat("x", 4096), "bytes"},
		{"a nested array of 2^31", "*1\r\n*" + huge + "\r\n", "elements"},
		{"a RESP3 map of 2^31 pairs", "%" + huge + "\r\n", "elements"},
		{"a RESP3 set of 2^31", "~" + huge + "\r\n", "elements"},
		{"a blob error of 2^31 bytes", "!" + huge + "\r\n", "bytes"},
		{"a length of 40 digits", "$" + strings.Repeat("0", 39) + "9\r\n", "digits"},
		{"a line that never ends", "+" + strings.Repeat("a", 200<<10), "line"},
		{"a negative count", "*-5\r\n", "count"},
		{"a negative length", "$-5\r\n", "length"},
		{"a count that is no number", "*many\r\n", "count"},
		{"an unknown reply type", "hello\r\n", ""},
		{"a number that is no number", ":seven\r\n", ""},
		{"a string where numbers belong", "*2\r\n$3\r\nabc\r\n:5\r\n", ""},
		{"a reply cut short", "*3\r\n:1\r\n", ""},
		{"an error", "-ERR I lie\r\n", "I lie"},
		{"an array too short for the policy", "*2\r\n:1\r\n:2\r\n", ""},
		{"nothing at all", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startLyingRedis(t, tc.lie)
			for _, batch := range []int{1, 0} { // one EVALSHA a decision, and batched
				s, err := New(Options{Settings: Settings{Addrs: []string{srv.ln.Addr().String()}, Timeout: algo.Duration(300 * time.Millisecond), Prefix: "lie:"}, Batch: batch})
				if err != nil {
					t.Fatal(err)
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				done := make(chan error, 1)
				go func() {
					var d core.Decision
					done <- s.Decide(context.Background(), policy, "k", 1, &d)
				}()
				var err2 error
				select {
				case err2 = <-done:
				case <-time.After(30 * time.Second): // the store's timeout is 0.3 s: this is a hang
					t.Fatalf("batch %d: no answer in 30 s", batch)
				}
				runtime.ReadMemStats(&after)
				s.Close()
				if err2 == nil {
					t.Fatalf("batch %d: the lie was taken for a decision", batch)
				}
				if !strings.Contains(err2.Error(), tc.want) && !errors.Is(err2, context.DeadlineExceeded) {
					t.Errorf("batch %d: error %q; want it to say %q", batch, err2, tc.want)
				}
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
					t.Errorf("batch %d: the decision allocated %d MiB", batch, grew>>20)
				}
			}
		})
	}
}

// TestPingProvesDecisions: a server that answers PING but fails every
// script is not healthy to the breaker's probe. Behind the failover store
// (on_error local), the breaker opens once and stays open while such a
// server is probed, instead of closing on each PING and opening again on
// the next decisions (a warning each time); a real Redis passes the probe.
func TestPingProvesDecisions(t *testing.T) {
	srv := startLyingRedis(t, "-ERR out of memory, scripts refused\r\n")
	s, err := New(Options{Settings: Settings{Addrs: []string{srv.ln.Addr().String()}, Timeout: algo.Duration(300 * time.Millisecond), Prefix: "ping:"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "answers PING but cannot decide") {
		t.Fatalf("Ping of a server that fails scripts: %v", err)
	}
	if err := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}}).Ping(context.Background()); err != nil {
		t.Fatalf("Ping of a real Redis: %v", err)
	}

	local, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int64
	f, err := failover.New(s, failover.Options{OnError: core.OnErrorLocal, Local: local, ProbeEvery: 10 * time.Millisecond,
		OnStateChange: func(bool, error) { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	policy := core.MustPolicy("ping", core.PolicyOptions{}, algo.Limit{Count: 1000, Window: time.Minute})
	decide := func() {
		var d core.Decision
		if err := f.Decide(context.Background(), policy, "k", 1, &d); err != nil {
			t.Fatalf("a decision behind the failover store: %v", err)
		}
	}
	waitfor.True(t, 10*time.Second, "the breaker open", func() bool { decide(); return f.Open() })
	pings := srv.count("PING")
	waitfor.True(t, 10*time.Second, "20 probes", func() bool { decide(); return srv.count("PING") >= pings+20 })
	if n := changes.Load(); n != 1 || !f.Open() {
		t.Fatalf("%d state changes over 20 probes (open %v); want the breaker opened once and still open", n, f.Open())
	}
}
