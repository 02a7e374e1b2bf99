package pluginserver

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/server/kong_plugin_protocol"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// headerConfig reads one request header in its access phase, as an
// allowed request's key is read.
// Its header "!panic" makes it panic instead.
type headerConfig struct {
	Header string `json:"header"`
	got    chan string
	closed atomic.Bool
}

var lastConfig atomic.Pointer[headerConfig]

func (c *headerConfig) Close() { c.closed.Store(true) }

// AccessEvent reads the header; a value "deny" leaves Kong a delayed 429
// for the event's end.
func (c *headerConfig) AccessEvent(kong *pdk.PDK, ev *Event) {
	if c.Header == "!panic" {
		panic("planted panic")
	}
	v, err := kong.Request.GetHeader(c.Header)
	if err != nil {
		v = "error: " + err.Error()
	}
	if v == "deny" {
		_ = ev.SetCtxAtEnd("delayed_response", map[string]any{"status_code": 429})
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
	l, err := Listen(SocketPath(t.TempDir(), "tollgate-test"))
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: l}
	s := New("tollgate-test", func(raw []byte) (any, error) {
		c := &headerConfig{got: make(chan string, 1)}
		if err := json.Unmarshal(raw, c); err != nil {
			return nil, err
		}
		lastConfig.Store(c)
		return c, nil
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

// TestDenialEndsInOneWrite: a handler's last call left for the event's
// end (a denial's set_ctx) goes out with the end and the reply in one
// write, Kong's reply to it is read and dropped, and the connection's
// next event is served as usual.
func TestDenialEndsInOneWrite(t *testing.T) {
	l, dial := start(t)
	k := dial()
	k.call(1, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"X-Key","__seq__":4}`)})
	k.status()
	cfg := lastConfig.Load()
	for i, value := range []string{"deny", "client-1", "deny", "client-2"} {
		before := l.writes.Load()
		k.call(int64(10+i), &kong_plugin_protocol.CmdHandleEvent{InstanceId: 4, EventName: "access"})
		k.mustFrame() // kong.request.get_header
		k.mustFrame()
		reply, _ := proto.Marshal(&kong_plugin_protocol.String{V: value})
		k.send(reply)
		if value == "deny" {
			if method := string(k.mustFrame()); method != "kong.nginx.set_ctx" {
				t.Fatalf("event %d: %q, want the end's set_ctx", i, method)
			}
			var kv kong_plugin_protocol.KV
			if err := proto.Unmarshal(k.mustFrame(), &kv); err != nil || kv.K != "delayed_response" {
				t.Fatalf("event %d: set_ctx %v (%v)", i, kv.K, err)
			}
			k.send(nil) // Kong's reply, which the server does not wait for
		}
		if end := k.mustFrame(); len(end) != 0 {
			t.Fatalf("event %d: the end %q, want an empty frame", i, end)
		}
		var ret kong_plugin_protocol.RpcReturn
		if err := proto.Unmarshal(k.mustFrame(), &ret); err != nil || ret.Sequence != int64(10+i) {
			t.Fatalf("event %d: reply %v (%v)", i, &ret, err)
		}
		if got := l.writes.Load() - before; got != 2 {
			t.Errorf("event %d (%s) took %d writes, want 2", i, value, got)
		}
		if v := <-cfg.got; v != value {
			t.Errorf("event %d read %q, want %q", i, v, value)
		}
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
	cfg := lastConfig.Load()
	k.call(3, &kong_plugin_protocol.CmdCloseInstance{InstanceId: 3})
	if st := k.status(); st.GetInstanceId() != 3 {
		t.Fatalf("close: %v, want instance 3", st)
	}
	if !cfg.closed.Load() {
		t.Error("closing the instance did not close its config")
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

// TestPanicCostsOneEvent: a handler that panics costs its event alone.
// Kong is told through kong.log.err (a line naming the plugin, the phase,
// the instance, the panic and where), the access event answers with Kong's
// delayed 500, and the event ends normally: the connection stays, and the
// process and its other instances go on serving.
func TestPanicCostsOneEvent(t *testing.T) {
	_, dial := start(t)
	k := dial()
	k.call(1, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"!panic","__seq__":8}`)})
	k.status()
	k.call(2, &kong_plugin_protocol.CmdStartInstance{Name: "tollgate", Config: []byte(`{"header":"X-Key","__seq__":9}`)})
	k.status()
	cfg := lastConfig.Load()
	answer := func(want string) []byte {
		t.Helper()
		if method := string(k.mustFrame()); method != want {
			t.Fatalf("PDK call %q, want %s", method, want)
		}
		args := k.mustFrame()
		k.send(nil)
		return args
	}
	for seq := int64(3); seq < 5; seq++ {
		k.call(seq, &kong_plugin_protocol.CmdHandleEvent{InstanceId: 8, EventName: "access"})
		var line structpb.ListValue
		if seq == 3 {
			if err := proto.Unmarshal(answer("kong.log.err"), &line); err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprint(line.AsSlice())
			for _, want := range []string{"tollgate-test: panic in the access phase of instance 8", ": planted panic (at ", "headerConfig).AccessEvent pluginserver_test.go"} {
				if !strings.Contains(got, want) {
					t.Errorf("the panic's line %s lacks %q", got, want)
				}
			}
		} // the second panic within a second is counted, not logged
		var kv kong_plugin_protocol.KV
		if err := proto.Unmarshal(answer("kong.nginx.set_ctx"), &kv); err != nil {
			t.Fatal(err)
		}
		if dr := kv.V.GetStructValue().AsMap(); kv.K != "delayed_response" || dr["status_code"] != float64(500) {
			t.Fatalf("set_ctx %s = %v, want Kong's delayed 500", kv.K, dr)
		}
		if end := k.mustFrame(); len(end) != 0 {
			t.Fatalf("the event's end: %q, want an empty frame", end)
		}
		k.status()
	}
	// The same connection, another instance: served.
	k.call(5, &kong_plugin_protocol.CmdHandleEvent{InstanceId: 9, EventName: "access"})
	reply, _ := proto.Marshal(&kong_plugin_protocol.String{V: "client-2"})
	if method := string(k.mustFrame()); method != "kong.request.get_header" {
		t.Fatalf("PDK call %q after the panics", method)
	}
	k.mustFrame()
	k.send(reply)
	k.mustFrame()
	k.status()
	if v := <-cfg.got; v != "client-2" {
		t.Errorf("after the panics the other instance read %q", v)
	}
}

func TestProcsBesideKong(t *testing.T) {
	for _, c := range []struct {
		cpus int
		env  string
		want int
	}{{1, "", 1}, {2, "", 1}, {3, "", 2}, {4, "", 2}, {16, "", 8}, {2, "2", 2}, {16, "3", 16}} {
		if got := ProcsBesideKong(c.cpus, c.env); got != c.want {
			t.Errorf("ProcsBesideKong(%d, %q) = %d, want %d", c.cpus, c.env, got, c.want)
		}
	}
}
