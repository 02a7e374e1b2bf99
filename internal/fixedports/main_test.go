package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReservePortsKeepsTheListAndAddsOnlyWhatIsMissing(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ip_local_reserved_ports")
	if err := os.WriteFile(file, []byte("1000-1002,55432\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	added, err := reservePorts(file, []int{55432, 36379, 1001, 36380})
	if err != nil {
		t.Fatal(err)
	}
	if joinPorts(added) != "36379,36380" {
		t.Errorf("added %v, want 36379,36380", added)
	}
	b, _ := os.ReadFile(file)
	if got := strings.TrimSpace(string(b)); got != "1000-1002,55432,36379,36380" {
		t.Errorf("file holds %q", got)
	}
	if added, err := reservePorts(file, []int{36380}); err != nil || len(added) != 0 {
		t.Errorf("again: added %v, err %v; want nothing", added, err)
	}

	if err := os.WriteFile(file, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := reservePorts(file, []int{55432}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); strings.TrimSpace(string(b)) != "55432" {
		t.Errorf("from empty: %q", b)
	}

	if err := os.WriteFile(file, []byte("12a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := reservePorts(file, []int{55432}); err == nil || !strings.Contains(err.Error(), `"12a"`) {
		t.Errorf("unreadable list: err %v, want one naming the item", err)
	}
}

func TestDecodeAddrReadsTheKernelsHex(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:D848":                         "127.0.0.1:55368",
		"00000000:0050":                         "0.0.0.0:80",
		"00000000000000000000000001000000:1F90": "[::1]:8080",
		"0000000000000000FFFF00000100007F:8E9C": "127.0.0.1:36508", // IPv4-mapped, as Go prints it
	} {
		host, port, err := decodeAddr(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := net.JoinHostPort(host, itoa(port)); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	for _, bad := range []string{"0100007F", "0100007G:0050", "01007F:0050", "0100007F:1FFFF"} {
		if _, _, err := decodeAddr(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func itoa(n int) string { return joinPorts([]int{n}) }

// TestTimeWaitKeepsAServerOffItsPort shows, in this machine's kernel, the
// failure CI met and what holders sees of it: a connection closed from the
// client side leaves its local port in TIME_WAIT, a listener (Go's sets
// SO_REUSEADDR, as Postgres and Redis do) cannot bind it, and holders names
// it until a listener has the port.
func TestTimeWaitKeepsAServerOffItsPort(t *testing.T) {
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := srv.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.TCPAddr).Port
	peer := <-accepted
	c.Close() // the client closes first: its side waits in TIME_WAIT
	defer peer.Close()
	buf := make([]byte, 1)
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := peer.Read(buf); err == nil {
		t.Fatal("read data; want the client's close")
	}
	peer.Close()

	var held map[int][]socket
	deadline := time.Now().Add(10 * time.Second)
	for {
		if held, err = holders([]int{port}); err != nil {
			t.Fatal(err)
		}
		if len(held[port]) > 0 && held[port][0].state == "TIME-WAIT" || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond) // the close's last ACK is in flight
	}
	if len(held[port]) == 0 || held[port][0].state != "TIME-WAIT" {
		t.Fatalf("holders(%d) = %v, want the client's socket in TIME-WAIT", port, held)
	}
	if !strings.Contains(describe(held), "TIME-WAIT 127.0.0.1:") {
		t.Errorf("describe: %s", describe(held))
	}

	if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(port))); err == nil {
		l.Close()
		t.Fatalf("a listener bound port %d while the closed connection held it", port)
	} else if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listen: %v, want EADDRINUSE", err)
	}

	var out strings.Builder
	err = waitFree([]int{port}, time.Millisecond, &out)
	if err == nil || !strings.Contains(err.Error(), "TIME-WAIT") {
		t.Errorf("waitFree: %v, want a timeout naming the TIME-WAIT socket", err)
	}
	if n := strings.Count(out.String(), "\n"); n > 1 {
		t.Errorf("waitFree said %d lines, want at most one:\n%s", n, out.String())
	}
}

func TestHoldersLeaveAPortToItsListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	held, err := holders([]int{port})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 0 {
		t.Errorf("holders = %v, want none: the port is its listener's", held)
	}
	var out strings.Builder
	if err := waitFree([]int{port}, time.Second, &out); err != nil || out.Len() != 0 {
		t.Errorf("waitFree: %v, said %q; want nil and nothing", err, out.String())
	}
}
