package pdklog

import (
	"bytes"
	"errors"
	"log"
	"net"
	"strings"
	"testing"
)

// TestWriterDropsEndedConnections: go-pdk's lines for connections Kong
// ended are dropped after one notice; every other line passes.
func TestWriterDropsEndedConnections(t *testing.T) {
	var out bytes.Buffer
	w := New(&out)
	l := log.New(w, "", log.LstdFlags)
	closed := &net.OpError{Op: "write", Net: "unix", Addr: &net.UnixAddr{Name: "/usr/local/kong/tollgate.socket", Net: "unix"}, Err: net.ErrClosed}
	for i := 0; i < 1000; i++ {
		l.Print(closed)
	}
	l.Print(errors.New("EOF"))
	l.Printf("tollgate: rate-limit store failing: dial tcp 127.0.0.1:6379: connection refused")
	l.Printf("closed instance 3")
	l.Printf("a policy named EOF")
	got := out.String()
	if strings.Count(got, "\n") != 4 || strings.Count(got, Notice) != 1 || !strings.Contains(got, "store failing") ||
		!strings.Contains(got, "closed instance 3") || !strings.Contains(got, "a policy named EOF") {
		t.Errorf("output:\n%s\nwant the notice once and the three other lines", got)
	}
	if w.Dropped() != 1001 {
		t.Errorf("dropped %d, want 1001", w.Dropped())
	}
}
