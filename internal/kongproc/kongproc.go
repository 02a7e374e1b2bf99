// Package kongproc plays Kong's side of the Go plugin protocol for tests: it
// builds and starts the real plugin binary (kongplugin/cmd/tollgate), dials
// its Unix socket and speaks go-pdk's protobuf framing exactly as Kong does
// (RpcCall frames; during an event, answers each PDK call the plugin makes).
package kongproc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Kong/go-pdk/bridge"
	pb "github.com/Kong/go-pdk/server/kong_plugin_protocol"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

var (
	buildMu     sync.Mutex
	built       = map[string]string{} // package → binary
	mainRunning bool                  // Main is running the tests
)

// Main is a TestMain body for packages whose tests build plugin servers: it
// runs the tests, then removes the binaries they built (each is tens of
// megabytes, built once per test process), and returns the exit code.
func Main(m interface{ Run() int }) int {
	buildMu.Lock()
	mainRunning = true
	buildMu.Unlock()
	code := m.Run()
	buildMu.Lock()
	defer buildMu.Unlock()
	for pkg, path := range built {
		os.RemoveAll(filepath.Dir(path))
		delete(built, pkg)
	}
	return code
}

// PluginPackage is the plugin server Kong runs: tollgate's, in the access
// phase only; ResponsePackage is tollgate-response's, which Kong also runs
// in the log phase (in-flight and adaptive limits need it);
// ResponseLimitsPackage is tollgate-response-ratelimiting's, the drop-in
// for Kong's response-ratelimiting (access and response phases).
const (
	PluginPackage         = "github.com/tollgate/tollgate/kongplugin/cmd/tollgate"
	ResponsePackage       = "github.com/tollgate/tollgate/kongplugin/cmd/tollgate-response"
	ResponseLimitsPackage = "github.com/tollgate/tollgate/kongplugin/cmd/tollgate-response-ratelimiting"
)

// Binary builds the plugin server once per test process and returns it,
// with the race detector when the tests have it.
func Binary(t testing.TB) string { return BinaryOf(t, PluginPackage) }

// BinaryOf builds the plugin server command pkg once per test process and
// returns it, named after pkg's last element (go-pdk names its socket after
// the binary). The package's TestMain must be Main, which removes it.
func BinaryOf(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if path, ok := built[pkg]; ok {
		return path
	}
	if !mainRunning {
		t.Fatal("kongproc: a package that builds plugin servers runs its tests with func TestMain(m *testing.M) { os.Exit(kongproc.Main(m)) }, which removes them afterwards")
	}
	dir, err := os.MkdirTemp("", "tollgate-kong")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, filepath.Base(pkg))
	// tollgate_testclock: the stores read openstore.TestClockFileEnv, for the
	// tests that move the plugin server's clock; production builds cannot.
	args := []string{"build", "-tags", "tollgate_testclock", "-o", path}
	if raceEnabled {
		// As the tests are built: the plugin shares their compiled
		// packages, and a data race in it fails the test that meets it.
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
		t.Fatalf("building the plugin %s: %v\n%s", pkg, err, out)
	}
	built[pkg] = path
	return path
}

// Server is a running plugin server.
type Server struct {
	// Prefix is its Kong prefix (-kong-prefix); Socket its Unix socket.
	Prefix, Socket string
	bin            string
	env            []string
	cmd            *exec.Cmd
	log            string
	exited         chan struct{}
	t              testing.TB
}

// Start runs the plugin server as Kong does (`tollgate -kong-prefix
// <dir>`), waits for its socket, and kills it when the test ends.
func Start(t testing.TB) *Server { return StartEnv(t) }

// StartEnv is Start with env ("NAME=value") added to the plugin server's
// environment, kept across Restart.
func StartEnv(t testing.TB, env ...string) *Server {
	t.Helper()
	return StartPackage(t, PluginPackage, env...)
}

// StartResponse is StartEnv for tollgate-response.
func StartResponse(t testing.TB, env ...string) *Server {
	t.Helper()
	return StartPackage(t, ResponsePackage, env...)
}

// StartPackage is StartEnv for the plugin server command pkg (see
// BinaryOf).
func StartPackage(t testing.TB, pkg string, env ...string) *Server {
	t.Helper()
	s := &Server{Prefix: t.TempDir(), t: t, env: env, bin: BinaryOf(t, pkg)}
	s.Socket = filepath.Join(s.Prefix, filepath.Base(s.bin)+".socket")
	s.log = filepath.Join(s.Prefix, "plugin.log")
	s.start()
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd = exec.Command(s.bin, "-kong-prefix", s.Prefix)
	s.cmd.Env = append(os.Environ(), s.env...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); logf.Close(); close(exited) }(s.cmd, s.exited)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", s.Socket); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("plugin socket %s did not appear:\n%s", s.Socket, s.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pid is the plugin server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Kill stops the plugin server with SIGKILL.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// Restart kills the plugin server and starts it again, as Kong does when
// its plugin server dies.
func (s *Server) Restart() {
	s.Kill()
	s.start()
}

// Log returns what the plugin server wrote to stderr.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// Client is Kong's side of the socket. Like Kong's socket pool it
// reconnects when the plugin closes the connection (after
// kong.response.exit in the response phase, or a call it cannot answer).
type Client struct {
	s    *Server
	conn net.Conn
	seq  int64
}

// Dial returns a client of s.
func (s *Server) Dial() *Client { return &Client{s: s} }

func (c *Client) connect() error {
	if c.conn != nil {
		return nil
	}
	conn, err := net.Dial("unix", c.s.Socket)
	if err != nil {
		return err
	}
	c.conn = conn
	return nil
}

func (c *Client) drop() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// Close closes the connection.
func (c *Client) Close() { c.drop() }

// ErrRefused is returned when the plugin closes the connection instead of
// answering a call (a config that is not JSON at all, an unknown instance).
var ErrRefused = errors.New("plugin closed the connection")

func (c *Client) call(call *pb.RpcCall) (*pb.RpcReturn, error) {
	if err := c.connect(); err != nil {
		return nil, err
	}
	c.seq++
	call.Sequence = c.seq
	b, err := proto.Marshal(call)
	if err != nil {
		return nil, err
	}
	if err := writeFrame(c.conn, b); err != nil {
		c.drop()
		return nil, err
	}
	reply, err := readFrame(c.conn)
	if err != nil {
		c.drop()
		return nil, ErrRefused
	}
	var ret pb.RpcReturn
	if err := proto.Unmarshal(reply, &ret); err != nil {
		return nil, err
	}
	return &ret, nil
}

// StartInstance starts a plugin instance with config (marshalled to JSON
// as Kong sends it) and returns its id.
func (c *Client) StartInstance(config any) (int32, error) {
	raw, err := json.Marshal(config)
	if err != nil {
		return 0, err
	}
	ret, err := c.call(&pb.RpcCall{Call: &pb.RpcCall_CmdStartInstance{CmdStartInstance: &pb.CmdStartInstance{Name: "tollgate", Config: raw}}})
	if err != nil {
		return 0, err
	}
	return ret.GetInstanceStatus().GetInstanceId(), nil
}

// PluginInfo sends GetPluginInfo, as Kong's pluginserver may. go-pdk
// v0.11.2 answers it with an empty return (Kong takes the info from the
// query command, -dump), so this checks the call is answered and the
// connection stays usable.
func (c *Client) PluginInfo() (*pb.PluginInfo, error) {
	ret, err := c.call(&pb.RpcCall{Call: &pb.RpcCall_CmdGetPluginInfo{CmdGetPluginInfo: &pb.CmdGetPluginInfo{Name: "tollgate"}}})
	if err != nil {
		return nil, err
	}
	return ret.GetPluginInfo(), nil
}

// InstanceStatus asks for instance id's status (GetInstanceStatus).
func (c *Client) InstanceStatus(id int32) (*pb.InstanceStatus, error) {
	ret, err := c.call(&pb.RpcCall{Call: &pb.RpcCall_CmdGetInstanceStatus{CmdGetInstanceStatus: &pb.CmdGetInstanceStatus{InstanceId: id}}})
	if err != nil {
		return nil, err
	}
	return ret.GetInstanceStatus(), nil
}

// CloseInstance closes instance id (CloseInstance), as Kong does when the
// plugin's config changes.
func (c *Client) CloseInstance(id int32) error {
	_, err := c.call(&pb.RpcCall{Call: &pb.RpcCall_CmdCloseInstance{CmdCloseInstance: &pb.CmdCloseInstance{InstanceId: id}}})
	return err
}

// Dump runs `tollgate -dump` (Kong's query command) and returns its output.
func Dump(t testing.TB) []byte { return DumpOf(t, PluginPackage) }

// DumpOf runs the -dump of the plugin server command pkg.
func DumpOf(t testing.TB, pkg string) []byte {
	t.Helper()
	out, err := exec.Command(BinaryOf(t, pkg), "-dump").Output()
	if err != nil {
		t.Fatalf("%s -dump: %v", filepath.Base(pkg), err)
	}
	return out
}

// Request is what Kong knows of a request, as the PDK reports it.
type Request struct {
	ForwardedIP  string // kong.client.get_forwarded_ip (after trusted_ips)
	ConsumerID   string
	ConsumerTags []string // the consumer entity's tags
	CredentialID string
	ServiceID    string
	RouteID      string
	Path         string
	Headers      http.Header
	// For the log phase: the response's status, its source (service, exit
	// or error) and the upstream's time to its first byte (seconds; Kong's
	// ctx.KONG_WAITING_TIME, in milliseconds).
	Status       int
	Source       string
	UpstreamTime string
	// ServiceHeaders are the upstream's response headers
	// (kong.service.response.get_header and get_headers).
	ServiceHeaders http.Header
	// RequestID is nginx's $kong_request_id.
	RequestID string
	// HTTPVersion is kong.request.get_http_version's answer (0: 1.1).
	HTTPVersion float64
	// Shared is kong.ctx.shared: give the access and the log phase of one
	// request the same map.
	Shared map[string]any
}

// Result is what the plugin did with a request.
type Result struct {
	// Exited is true when the plugin ended the request: it called
	// kong.response.exit, or set ngx.ctx.delayed_response in the access
	// phase (kong.nginx.set_ctx), which Kong answers after the event.
	Exited bool
	Status int
	// Body is what the plugin sent with kong.response.exit, or for a
	// delayed response the body kong.response.error renders when the
	// request has no Accept header (Kong's JSON template with the message
	// and RequestID). The formats Accept and gRPC choose are Kong's own
	// code: internal/kongreal checks them in real Kong.
	Body string
	// Message is a delayed response's content.message.
	Message string
	// Delayed is true when the answer is a delayed response: the event
	// ended normally and the connection stays open.
	Delayed bool
	// Headers are the response headers it set (or exited with).
	Headers http.Header
	// Logs are its kong.log.* lines.
	Logs []string
	// Calls are the PDK methods it called, in order.
	Calls []string
	// Cleared are the response headers it cleared
	// (kong.response.clear_header).
	Cleared []string
}

// Access runs the access phase of instance id for req.
func (c *Client) Access(id int32, req Request) (*Result, error) {
	return c.event(id, "access", req)
}

// Response runs the response phase of instance id for req: Kong has the
// upstream's whole response (its status and ServiceHeaders) buffered.
func (c *Client) Response(id int32, req Request) (*Result, error) {
	return c.event(id, "response", req)
}

// Log runs the log phase of instance id for req (after the response).
func (c *Client) Log(id int32, req Request) (*Result, error) {
	return c.event(id, "log", req)
}

func (c *Client) event(id int32, name string, req Request) (*Result, error) {
	if err := c.connect(); err != nil {
		return nil, err
	}
	c.seq++
	b, _ := proto.Marshal(&pb.RpcCall{Sequence: c.seq, Call: &pb.RpcCall_CmdHandleEvent{CmdHandleEvent: &pb.CmdHandleEvent{InstanceId: id, EventName: name}}})
	if err := writeFrame(c.conn, b); err != nil {
		c.drop()
		return nil, err
	}
	res := &Result{Headers: http.Header{}}
	for {
		method, err := readFrame(c.conn)
		if err != nil {
			c.drop()
			if res.Exited {
				return res, nil // exit closes the connection, as in Kong
			}
			return res, fmt.Errorf("connection lost during %s: %w", name, err)
		}
		if len(method) == 0 {
			// The handler returned: the RpcReturn follows.
			if _, err := readFrame(c.conn); err != nil {
				c.drop()
				return res, err
			}
			if res.Delayed {
				flushDelayed(req, res)
			}
			return res, nil
		}
		args, err := readFrame(c.conn)
		if err != nil {
			c.drop()
			return res, err
		}
		res.Calls = append(res.Calls, string(method))
		out, err := answer(name, string(method), args, req, res)
		if err != nil {
			c.drop()
			return res, err
		}
		var reply []byte
		if out != nil {
			if reply, err = proto.Marshal(out); err != nil {
				return res, err
			}
		}
		if err := writeFrame(c.conn, reply); err != nil {
			c.drop()
			return res, err
		}
	}
}

// answer replies to one PDK call made in phase as Kong 3.9 would for req.
// Where real Kong refuses a call in a phase, so does answer: the log phase
// of a Go plugin runs in a timer (kong/runloop/plugin_servers/plugin.lua,
// build_phases), where ngx.var and kong.service.response are disabled,
// and kong.response's getters read what Kong saved of the response; in the
// response phase kong.service.response.get_headers is a proxy table that
// iterates empty (kong/pdk/service/response.lua, attach_buffered_headers_mt).
func answer(phase, method string, args []byte, req Request, res *Result) (proto.Message, error) {
	if phase == "log" && (method == "kong.nginx.get_var" || strings.HasPrefix(method, "kong.service.response.")) {
		return nil, fmt.Errorf("%s in the log phase: Kong runs it in a timer, where it raises \"API disabled in the current context\"", method)
	}
	switch method {
	case "kong.response.get_headers":
		return bridge.WrapHeaders(req.ServiceHeaders)
	case "kong.nginx.get_ctx":
		var name pb.String
		if err := proto.Unmarshal(args, &name); err != nil {
			return nil, err
		}
		if name.V == "KONG_WAITING_TIME" && req.UpstreamTime != "" {
			secs, err := strconv.ParseFloat(req.UpstreamTime, 64)
			if err != nil {
				return nil, err
			}
			return structpb.NewValue(secs * 1000)
		}
		return structpb.NewNullValue(), nil
	case "kong.client.get_forwarded_ip", "kong.client.get_ip":
		return bridge.WrapString(req.ForwardedIP), nil
	case "kong.client.get_consumer":
		return &pb.Consumer{Id: req.ConsumerID, Tags: req.ConsumerTags}, nil
	case "kong.client.get_credential":
		return &pb.AuthenticatedCredential{Id: req.CredentialID, ConsumerId: req.ConsumerID}, nil
	case "kong.router.get_service":
		return &pb.Service{Id: req.ServiceID}, nil
	case "kong.router.get_route":
		return &pb.Route{Id: req.RouteID}, nil
	case "kong.response.get_status":
		return &pb.Int{V: int32(req.Status)}, nil
	case "kong.response.get_source":
		return bridge.WrapString(req.Source), nil
	case "kong.service.response.get_header", "kong.response.get_header": // the response is the upstream's
		var name pb.String
		if err := proto.Unmarshal(args, &name); err != nil {
			return nil, err
		}
		return bridge.WrapString(req.ServiceHeaders.Get(name.V)), nil
	case "kong.service.response.get_headers":
		if phase == "response" {
			return bridge.WrapHeaders(http.Header{})
		}
		return bridge.WrapHeaders(req.ServiceHeaders)
	case "kong.response.clear_header":
		var name pb.String
		if err := proto.Unmarshal(args, &name); err != nil {
			return nil, err
		}
		res.Cleared = append(res.Cleared, name.V)
		return nil, nil
	case "kong.nginx.get_var":
		var name pb.String
		if err := proto.Unmarshal(args, &name); err != nil {
			return nil, err
		}
		switch name.V {
		case "upstream_response_time":
			return bridge.WrapString(req.UpstreamTime), nil
		case "kong_request_id":
			return bridge.WrapString(req.RequestID), nil
		}
		return bridge.WrapString(""), nil
	case "kong.ctx.shared.set":
		var kv pb.KV
		if err := proto.Unmarshal(args, &kv); err != nil {
			return nil, err
		}
		if req.Shared == nil {
			return nil, fmt.Errorf("kong.ctx.shared.set %q: the test gave the request no Shared map", kv.K)
		}
		req.Shared[kv.K] = kv.V.AsInterface()
		return nil, nil
	case "kong.ctx.shared.get":
		var name pb.String
		if err := proto.Unmarshal(args, &name); err != nil {
			return nil, err
		}
		return structpb.NewValue(req.Shared[name.V])
	case "kong.request.get_path":
		return bridge.WrapString(req.Path), nil
	case "kong.request.get_http_version":
		if req.HTTPVersion == 0 {
			return &pb.Number{V: 1.1}, nil
		}
		return &pb.Number{V: req.HTTPVersion}, nil
	case "kong.request.get_header":
		var name pb.String
		if err := proto.Unmarshal(args, &name); err != nil {
			return nil, err
		}
		return bridge.WrapString(req.Headers.Get(name.V)), nil
	case "kong.response.set_header":
		var kv pb.KV
		if err := proto.Unmarshal(args, &kv); err != nil {
			return nil, err
		}
		res.Headers.Set(kv.K, kv.V.GetStringValue())
		return nil, nil
	case "kong.response.set_headers":
		var st structpb.Struct
		if err := proto.Unmarshal(args, &st); err != nil {
			return nil, err
		}
		for k, v := range bridge.UnwrapHeaders(&st) {
			res.Headers[http.CanonicalHeaderKey(k)] = v
		}
		return nil, nil
	case "kong.nginx.set_ctx":
		var kv pb.KV
		if err := proto.Unmarshal(args, &kv); err != nil {
			return nil, err
		}
		if kv.K == "delayed_response" && phase == "access" {
			return nil, delay(kv.V, res)
		}
		return nil, nil
	case "kong.response.exit":
		var ex pb.ExitArgs
		if err := proto.Unmarshal(args, &ex); err != nil {
			return nil, err
		}
		res.Exited, res.Status, res.Body = true, int(ex.Status), string(ex.Body)
		if ex.Headers != nil {
			for k, v := range bridge.UnwrapHeaders(ex.Headers) {
				res.Headers[http.CanonicalHeaderKey(k)] = v
			}
		}
		return nil, nil
	}
	if strings.HasPrefix(method, "kong.log.") {
		var l structpb.ListValue
		if err := proto.Unmarshal(args, &l); err != nil {
			return nil, err
		}
		var parts []string
		for _, v := range l.AsSlice() {
			parts = append(parts, fmt.Sprint(v))
		}
		res.Logs = append(res.Logs, strings.TrimPrefix(method, "kong.log.")+": "+strings.Join(parts, " "))
		return nil, nil
	}
	return nil, fmt.Errorf("the test's Kong does not implement PDK method %s", method)
}

// delay takes a delayed response as Kong's access phase does: Kong reads
// ngx.ctx.delayed_response once the plugin's handler returns
// (kong/init.lua, execute_collecting_plugins_iterator) and answers with
// kong.response.error(status_code, content.message, headers)
// (flush_delayed_response). A value Kong could not answer with fails the
// test.
func delay(v *structpb.Value, res *Result) error {
	dr, ok := v.AsInterface().(map[string]any)
	if !ok {
		return fmt.Errorf("delayed_response %v: not a table", v.AsInterface())
	}
	status, ok := dr["status_code"].(float64)
	if !ok || status < 400 || status > 599 || status != float64(int(status)) {
		return fmt.Errorf("delayed_response status_code %v: kong.response.error takes 400 to 599", dr["status_code"])
	}
	if content, ok := dr["content"].(map[string]any); ok {
		if res.Message, ok = content["message"].(string); !ok {
			return fmt.Errorf("delayed_response content.message %v: not a string", content["message"])
		}
	}
	if headers, ok := dr["headers"].(map[string]any); ok {
		for k, v := range headers {
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("delayed_response header %s: %v is not a string", k, v)
			}
			res.Headers.Set(k, s)
		}
	}
	res.Delayed, res.Status = true, int(status)
	return nil
}

// flushDelayed ends a request with its delayed response after the event,
// as Kong's flush_delayed_response does, rendered as kong.response.error
// renders a request without Accept: kong/tools/http.lua's JSON template,
// into which Kong formats the message and request id unescaped.
func flushDelayed(req Request, res *Result) {
	res.Exited = true
	res.Body = fmt.Sprintf("{\n  \"message\":\"%s\",\n  \"request_id\":\"%s\"\n}", res.Message, req.RequestID)
	res.Headers.Set("Content-Type", "application/json; charset=utf-8")
}

func readFrame(r io.Reader) ([]byte, error) {
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

func writeFrame(w io.Writer, b []byte) error {
	if err := binary.Write(w, binary.LittleEndian, uint32(len(b))); err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	_, err := w.Write(b)
	return err
}
