package pluginserver

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/server/kong_plugin_protocol"
	"google.golang.org/protobuf/proto"
)

// headerConfig reads one request header in its access phase, as an
// allowed request's key is read.
type headerConfig struct {
	Header string `json:"header"`
	got    chan string
}

var lastConfig atomic.Pointer[headerConfig]

func (c *headerConfig) Access(kong *pdk.PDK) {
	v, err := kong.Request.GetHeader(c.Header)
	if err != nil {
		v = "error: " + err.Error()
	}
	c.got <- v
}

// countingListener counts the writes of every connection it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// kong is the test's side of a connection, speaking as pb_rpc.lua does.
type kong struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (k *kong) send(b []byte) {
	k.t.Helper()
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := k.c.Write(append(n[:], b...)); err != nil {
		k.t.Fatal(err)
	}
}

func (k *kong) call(seq int64, m proto.Message) {
	k.t.Helper()
	call := &kong_plugin_protocol.RpcCall{Sequence: seq}
	switch m := m.(type) {
	case *kong_plugin_protocol.CmdStartInstance:
		call.Call = &kong_plugin_protocol.RpcCall_CmdStartInstance{CmdStartInstance: m}
	case *kong_plugin_protocol.CmdHandleEvent:
		call.Call = &kong_plugin_protocol.RpcCall_CmdHandleEvent{CmdHandleEvent: m}
	case *kong_plugin_protocol.CmdCloseInstance:
		call.Call = &kong_plugin_protocol.RpcCall_CmdCloseInstance{CmdCloseInstance: m}
	}
	b, err := proto.Marshal(call)
	if err != nil {
		k.t.Fatal(err)
	}
	k.send(b)
}

func (k *kong) frame() ([]byte, error) { return readFrame(k.r) }

func (k *kong) mustFrame() []byte {
	k.t.Helper()
	b, err := k.frame()
	if err != nil {
		k.t.Fatal(err)
	}
	return b
}

func (k *kong) status() *kong_plugin_protocol.InstanceStatus {
	k.t.Helper()
	var ret kong_plugin_protocol.RpcReturn
	if err := proto.Unmarshal(k.mustFrame(), &ret); err != nil {
		k.t.Fatal(err)
	}
	return ret.GetInstanceStatus()
}

func start(t *testing.T) (*countingListener, func() *kong) {
	l, err := Listen(t.TempDir(), "tollgate-test")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: l}
	s := New(func() any {
		c := &headerConfig{got: make(chan string, 1)}
		lastConfig.Store(c)
		return c
	})
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(cl) }()
	t.Cleanup(func() { l.Close(); <-done })
	return cl, func() *kong {
		c, err := net.Dial("unix", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &kong{t: t, c: c, r: bufio.NewReader(c)}
	}
}

// TestEventInTwoWrites: an access event with one PDK call reaches Kong in
// two writes, the call's two frames in one and the event's end and reply
// in the other (go-pdk's server and bridge write each of the four frames as two).
// Kong's instance id is its __seq__, and the instance answers every
// connection.
func TestEventInTwoWrites(t *testing.T) {
	l, dial := start(t)
	k := dial()
	k.call(1, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"X-Key","__seq__":7}`)})
	if st := k.status(); st.GetInstanceId() != 7 || st.GetName() != "tollgate" {
		t.Fatalf("instance status %v, want id 7 (the config's __seq__)", st)
	}
	cfg := lastConfig.Load()

	k = dial() // Kong's workers use any connection for any instance
	before := l.writes.Load()
	k.call(2, &kong_plugin_protocol.CmdHandleEvent{InstanceId: 7, EventName: "access"})
	if method := string(k.mustFrame()); method != "kong.request.get_header" {
		t.Fatalf("PDK call %q, want kong.request.get_header", method)
	}
	var arg kong_plugin_protocol.String
	if err := proto.Unmarshal(k.mustFrame(), &arg); err != nil || arg.V != "X-Key" {
		t.Fatalf("its argument %v (%v), want X-Key", arg.V, err)
	}
	if got := l.writes.Load() - before; got != 1 {
		t.Errorf("the PDK call's two frames took %d writes, want 1", got)
	}
	reply, _ := proto.Marshal(&kong_plugin_protocol.String{V: "client-1"})
	k.send(reply)
	if end := k.mustFrame(); len(end) != 0 {
		t.Fatalf("the event's end: %q, want an empty frame", end)
	}
	var ret kong_plugin_protocol.RpcReturn
	if err := proto.Unmarshal(k.mustFrame(), &ret); err != nil || ret.Sequence != 2 {
		t.Fatalf("the event's reply: %v (%v), want sequence 2", &ret, err)
	}
	if got := l.writes.Load() - before; got != 2 {
		t.Errorf("the event took %d writes, want 2", got)
	}
	if v := <-cfg.got; v != "client-1" {
		t.Errorf("the plugin read %q, want Kong's answer client-1", v)
	}
}

// TestUnknownInstanceClosesTheConnection: an event for an instance this
// process does not have (it restarted) is answered by closing the
// connection, which Kong takes as the sign to start the instance again;
// a closed instance is unknown from then on.
func TestUnknownInstanceClosesTheConnection(t *testing.T) {
	_, dial := start(t)
	k := dial()
	k.call(1, &kong_plugin_protocol.CmdHandleEvent{InstanceId: 99, EventName: "access"})
	if _, err := k.frame(); !errors.Is(err, io.EOF) {
		t.Fatalf("after an event for an unknown instance: %v, want the connection closed (EOF)", err)
	}

	k = dial()
	k.call(2, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"X-Key","__seq__":3}`)})
	k.status()
	k.call(3, &kong_plugin_protocol.CmdCloseInstance{InstanceId: 3})
	if st := k.status(); st.GetInstanceId() != 3 {
		t.Fatalf("close: %v, want instance 3", st)
	}
	k.call(4, &kong_plugin_protocol.CmdHandleEvent{InstanceId: 3, EventName: "access"})
	if _, err := k.frame(); !errors.Is(err, io.EOF) {
		t.Fatalf("an event for a closed instance: %v, want the connection closed", err)
	}
}

// TestEndedMidEventIsQuiet: Kong ends the connection in the middle of an
// event (it does after a plugin's kong.response.exit); the server ends
// that connection without logging (Kong writes a plugin server's output
// to its log, so a denial flood would flood it) and goes on serving.
func TestEndedMidEventIsQuiet(t *testing.T) {
	var logged bytes.Buffer
	log.SetOutput(&logged)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	_, dial := start(t)
	k := dial()
	k.call(1, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"X-Key","__seq__":5}`)})
	k.status()
	cfg := lastConfig.Load()
	for i := 0; i < 20; i++ {
		k := dial()
		k.call(int64(i), &kong_plugin_protocol.CmdHandleEvent{InstanceId: 5, EventName: "access"})
		k.mustFrame() // the PDK call's method
		k.c.Close()   // Kong's thread ended
		<-cfg.got     // the handler ran to its end
	}
	k = dial()
	k.call(100, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"X-Key","__seq__":6}`)})
	if st := k.status(); st.GetInstanceId() != 6 {
		t.Fatalf("after 20 connections ended mid-event: %v, want instance 6 started", st)
	}
	if logged.Len() > 0 {
		t.Errorf("20 connections ended mid-event logged:\n%s", logged.String())
	}
}
