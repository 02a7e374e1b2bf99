// Package pluginserver serves Kong's plugin-server protocol (ProtoBuf:1,
// kong/include/kong/pluginsocket.proto; Kong's side is
// kong/runloop/plugin_servers/rpc/pb_rpc.lua) for the tollgate plugin
// servers, with go-pdk's PDK for the calls back into Kong.
//
// It replaces go-pdk's own server loop for one reason: speed inside Kong.
// go-pdk writes every frame as two writes (its length, then its bytes),
// so one PDK call costs four writes and Kong's worker may wake for each.
// Here a connection's writes are buffered until it next reads, so a PDK
// call, or an event's end and its reply, reach Kong in one write, and a
// frame is read from a buffer, not in two reads.
package pluginserver

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/server/kong_plugin_protocol"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tollgate/tollgate/kongplugin/internal/earlysocket"
)

// maxFrame bounds a frame's length (bytes): Kong's largest are an
// instance's config and a response body it hands back.
const maxFrame = 64 << 20

// Handlers are the phases a config answers, by the names Kong gives its
// events; a config implements any of them.
type (
	accesser  interface{ Access(*pdk.PDK) }
	responser interface{ Response(*pdk.PDK) }
	logger    interface{ Log(*pdk.PDK) }
	rewriter  interface{ Rewrite(*pdk.PDK) }
	// closer is a config that holds something to give back when Kong
	// closes its instance (CmdCloseInstance).
	closer interface{ Close() }
	// eventAccesser is an access handler that may leave a last call for
	// the event's end (Event.SetCtxAtEnd); it is preferred to Access.
	eventAccesser interface{ AccessEvent(*pdk.PDK, *Event) }
)

// Flush makes the call SetCtxAtEnd left as an ordinary PDK call, for a
// handler run by a caller that does not know Event (go-pdk's test
// environment).
func (e *Event) Flush(kong *pdk.PDK) error {
	if e.endCtx == nil {
		return nil
	}
	v := e.endCtx
	e.endCtx = nil
	return kong.Nginx.SetCtx(v.K, v.V.AsInterface())
}

// handler answers one event: its PDK, and what it leaves for the event's end.
type handler func(*pdk.PDK, *Event)

// Event is what an event's handler leaves for the event's end.
type Event struct {
	endCtx *kong_plugin_protocol.KV
}

// SetCtxAtEnd sets ngx.ctx[key] = value in Kong (the PDK's
// kong.nginx.set_ctx) as the event's last call, sent with the event's end
// in one write: the event does not wait for Kong's reply to it, which
// the server reads and drops before the connection's next call. A second
// call replaces the first.
func (e *Event) SetCtxAtEnd(key string, value any) error {
	v, err := structpb.NewValue(value)
	if err != nil {
		return err
	}
	e.endCtx = &kong_plugin_protocol.KV{K: key, V: v}
	return nil
}

// Server keeps the plugin's instances (one per plugin config Kong starts)
// and answers Kong's calls on every connection.
type Server struct {
	name   string                           // the plugin's name, in log lines
	start  func(config []byte) (any, error) // an instance from the config Kong sends
	panics panicLog

	mu        sync.RWMutex
	instances map[int32]*instance
}

type instance struct {
	id       int32
	started  time.Time
	config   any
	handlers map[string]handler
}

// New returns a server of the plugin name whose instances start answers
// from the config Kong sends (its JSON). An instance answers the events
// its handlers name (Access or AccessEvent, Response, Log, Rewrite; an
// event it has no handler for ends at once), and Close, if it has one,
// when Kong closes it.
func New(name string, start func(config []byte) (any, error)) *Server {
	return &Server{name: name, start: start, instances: map[int32]*instance{}}
}

// SocketPath is the Unix socket Kong, whose prefix is prefix, connects to
// for the plugin server named name.
func SocketPath(prefix, name string) string { return filepath.Join(prefix, name+".socket") }

// Listen opens the Unix socket Kong connects to, path (SocketPath),
// replacing one that is there.
// Replacing a live server's socket is how `kong reload` works: Kong's new
// workers start a new plugin server while the old one still serves the
// old workers' connections, until they exit and Kong stops it
// (kong/runloop/plugin_servers/process.lua). A command run by mistake
// cannot get here: the command line refuses what it does not know before
// anything is opened (command.Main).
//
// The socket the program opened as it started (earlysocket), if it is
// this one, is taken over rather than replaced.
func Listen(path string) (net.Listener, error) {
	if f := earlysocket.Take(path); f != nil {
		l, err := net.FileListener(f)
		f.Close()
		if err == nil {
			l.(*net.UnixListener).SetUnlinkOnClose(true)
			return l, nil
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old socket: %w", err)
	}
	return net.Listen("unix", path)
}

// Serve answers every connection l accepts until l fails.
func (s *Server) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go s.serveConn(c)
	}
}

// conn buffers a connection's writes until it next reads (or the event
// ends), and its reads.
type conn struct {
	net.Conn
	r *bufio.Reader
	w *bufio.Writer
	// unread counts the replies Kong owes to calls whose replies the
	// server did not wait for (Event.SetCtxAtEnd): the next frames on the
	// connection, dropped before its next call is read.
	unread int
}

func (c *conn) Read(p []byte) (int, error) {
	if c.w.Buffered() > 0 {
		if err := c.w.Flush(); err != nil {
			return 0, err
		}
	}
	return c.r.Read(p)
}

func (c *conn) Write(p []byte) (int, error) { return c.w.Write(p) }

// serveConn answers one connection's calls in turn until Kong closes it.
// An error ends the connection without a word: Kong ends connections
// mid-event (after a plugin's kong.response.exit), and an event for an
// instance this process does not have is answered by closing, which Kong
// takes as a sign to start the instance again (pb_rpc.lua, handle_event).
func (s *Server) serveConn(nc net.Conn) {
	defer nc.Close()
	c := &conn{Conn: nc, r: bufio.NewReaderSize(nc, 4096), w: bufio.NewWriterSize(nc, 4096)}
	for {
		for ; c.unread > 0; c.unread-- {
			if _, err := readFrame(c.r); err != nil {
				return
			}
		}
		frame, err := readFrame(c.r)
		if err != nil {
			return
		}
		var call kong_plugin_protocol.RpcCall
		if err := proto.Unmarshal(frame, &call); err != nil {
			return
		}
		reply, err := s.handle(c, &call)
		if err != nil {
			if _, starting := call.Call.(*kong_plugin_protocol.RpcCall_CmdStartInstance); starting {
				log.Printf("starting an instance: %v", err) // once per config Kong sends
			}
			return
		}
		var out []byte
		if reply != nil {
			if out, err = proto.Marshal(reply); err != nil {
				return
			}
		}
		if writeFrame(c.w, out) != nil || c.w.Flush() != nil {
			return
		}
	}
}

// handle answers one call; a nil reply is an empty frame.
func (s *Server) handle(c *conn, call *kong_plugin_protocol.RpcCall) (*kong_plugin_protocol.RpcReturn, error) {
	switch m := call.Call.(type) {
	case *kong_plugin_protocol.RpcCall_CmdHandleEvent:
		inst, err := s.lookup(m.CmdHandleEvent.InstanceId)
		if err != nil {
			return nil, err
		}
		h := inst.handlers[m.CmdHandleEvent.EventName]
		if h == nil {
			// Ended at once: closing the connection would make Kong start
			// the instance again and send the same event, without end.
			h = func(*pdk.PDK, *Event) {}
		}
		ev, err := s.runEvent(h, c, inst, m.CmdHandleEvent.EventName)
		if err != nil {
			return nil, err
		}
		if ev.endCtx != nil {
			args, err := proto.Marshal(ev.endCtx)
			if err != nil {
				return nil, err
			}
			if err := writeFrame(c.w, []byte("kong.nginx.set_ctx")); err != nil {
				return nil, err
			}
			if err := writeFrame(c.w, args); err != nil {
				return nil, err
			}
			c.unread++
		}
		// The bridge loop's end: an empty method name, before the reply.
		if err := writeFrame(c.w, nil); err != nil {
			return nil, err
		}
		return &kong_plugin_protocol.RpcReturn{Sequence: call.Sequence}, nil
	case *kong_plugin_protocol.RpcCall_CmdStartInstance:
		inst, err := s.startInstance(m.CmdStartInstance.Config)
		if err != nil {
			return nil, err
		}
		return status(call.Sequence, m.CmdStartInstance.Name, inst), nil
	case *kong_plugin_protocol.RpcCall_CmdGetInstanceStatus:
		inst, err := s.lookup(m.CmdGetInstanceStatus.InstanceId)
		if err != nil {
			return nil, err
		}
		return status(call.Sequence, "", inst), nil
	case *kong_plugin_protocol.RpcCall_CmdCloseInstance:
		s.mu.Lock()
		inst := s.instances[m.CmdCloseInstance.InstanceId]
		delete(s.instances, m.CmdCloseInstance.InstanceId)
		s.mu.Unlock()
		if inst == nil {
			return nil, fmt.Errorf("no plugin instance %d", m.CmdCloseInstance.InstanceId)
		}
		if c, ok := inst.config.(closer); ok {
			c.Close() // what the instance holds goes back
		}
		log.Printf("closed instance %d", inst.id) // a config Kong no longer runs
		return status(call.Sequence, "", inst), nil
	case *kong_plugin_protocol.RpcCall_CmdGetPluginNames, *kong_plugin_protocol.RpcCall_CmdGetPluginInfo:
		return nil, nil // Kong reads these from the query command (-dump)
	default:
		return nil, fmt.Errorf("unknown call %T", m)
	}
}

// lookup returns the instance Kong started as id.
func (s *Server) lookup(id int32) (*instance, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if inst := s.instances[id]; inst != nil {
		return inst, nil
	}
	return nil, fmt.Errorf("no plugin instance %d", id)
}

// startInstance starts an instance from its config and keeps it under
// Kong's sequence number for that config (__seq__), or a free random id
// without one.
func (s *Server) startInstance(raw []byte) (*instance, error) {
	var meta struct {
		Seq int32 `json:"__seq__"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, err
	}
	config, err := s.startRecovered(raw)
	if err != nil {
		return nil, err // the config's own error; Kong logs the closed connection
	}
	inst := &instance{started: time.Now(), config: config, handlers: map[string]handler{}}
	plain := func(h func(*pdk.PDK)) handler { return func(kong *pdk.PDK, _ *Event) { h(kong) } }
	if h, ok := config.(eventAccesser); ok {
		inst.handlers["access"] = h.AccessEvent
	} else if h, ok := config.(accesser); ok {
		inst.handlers["access"] = plain(h.Access)
	}
	if h, ok := config.(responser); ok {
		inst.handlers["response"] = plain(h.Response)
	}
	if h, ok := config.(logger); ok {
		inst.handlers["log"] = plain(h.Log)
	}
	if h, ok := config.(rewriter); ok {
		inst.handlers["rewrite"] = plain(h.Rewrite)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	inst.id = meta.Seq
	for inst.id == 0 || (meta.Seq == 0 && s.instances[inst.id] != nil) {
		inst.id = rand.Int32()
	}
	s.instances[inst.id] = inst
	return inst, nil
}

// startRecovered starts an instance; a panic while doing so is the
// config's error, not the process's end.
func (s *Server) startRecovered(raw []byte) (config any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic while starting the instance: %v (at %s)", r, panicSite())
		}
	}()
	return s.start(raw)
}

// runEvent runs one event's handler. A panic costs that event alone: the
// process, its counters and every other instance go on. As Kong answers a
// Lua plugin's error in the access phase (kong/init.lua,
// execute_collecting_plugins_iterator: kong.log.err, then a delayed 500
// "An unexpected error occurred"), the panic is logged through
// kong.log.err, so it shows at Kong's default log level with the request's
// context, and an access event answers with that 500. The event then ends
// normally: closing the connection instead would make Kong forget every
// instance of the plugin and send the same event again
// (rpc/pb_rpc.lua, handle_event), and a panic that every such request
// meets would never end. Only when Kong cannot be told (the PDK calls
// fail) is the connection closed and the panic written to the process's
// log.
func (s *Server) runEvent(h handler, c *conn, inst *instance, phase string) (ev *Event, err error) {
	ev = &Event{}
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		ev.endCtx = nil // what the handler left is not its answer
		line := fmt.Sprintf("%s: panic in the %s phase of instance %d: %v (at %s)", s.name, phase, inst.id, r, panicSite())
		kong := pdk.Init(c)
		if logged, ok := s.panics.admit(); ok {
			if logged > 0 {
				line += fmt.Sprintf("; %d more panics since the last line", logged)
			}
			err = kong.Log.Err(line)
		}
		if err == nil && phase == "access" {
			err = ev.SetCtxAtEnd("delayed_response", map[string]any{
				"status_code": 500, "content": map[string]any{"message": "An unexpected error occurred"},
			})
		}
		if err != nil {
			log.Print(line)
		}
	}()
	h(pdk.Init(c), ev)
	return ev, nil
}

// panicSite names the function and line that panicked, for a log line
// of its own: called in a deferred recover, it skips the runtime's frames.
func panicSite() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			return fmt.Sprintf("%s %s:%d", f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return "unknown"
		}
	}
}

// panicLog lets one panic line a second reach Kong's log; it counts the
// rest, which the next line reports.
type panicLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// admit reports whether a panic may be logged now, and how many were not
// since the last line.
func (p *panicLog) admit() (suppressed int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := time.Now(); now.Sub(p.last) >= time.Second {
		p.last, suppressed, p.suppressed = now, p.suppressed, 0
		return suppressed, true
	}
	p.suppressed++
	return 0, false
}

func status(seq int64, name string, inst *instance) *kong_plugin_protocol.RpcReturn {
	return &kong_plugin_protocol.RpcReturn{Sequence: seq, Return: &kong_plugin_protocol.RpcReturn_InstanceStatus{
		InstanceStatus: &kong_plugin_protocol.InstanceStatus{Name: name, InstanceId: inst.id, StartedAt: inst.started.Unix()},
	}}
}

// readFrame reads one frame: its length (4 bytes, little-endian), then
// its bytes.
func readFrame(r *bufio.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxFrame {
		return nil, fmt.Errorf("a frame of %d bytes", size)
	}
	b := make([]byte, size)
	_, err := io.ReadFull(r, b)
	return b, err
}

// writeFrame buffers one frame.
func writeFrame(w *bufio.Writer, b []byte) error {
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// ListenAndServe serves the plugin named name, whose instances start
// makes (see New), on the Unix socket path (SocketPath).
func ListenAndServe(name, path string, start func(config []byte) (any, error)) error {
	l, err := Listen(path)
	if err != nil {
		return err
	}
	defer l.Close()
	log.Printf("listening on %s, GOMAXPROCS %d", l.Addr(), runtime.GOMAXPROCS(0))
	return New(name, start).Serve(l)
}

// RunBesideKong sets the process's GOMAXPROCS to ProcsBesideKong's, env
// being the GOMAXPROCS environment variable: a plugin server's main calls
// it before it serves.
func RunBesideKong(env string) { runtime.GOMAXPROCS(ProcsBesideKong(runtime.GOMAXPROCS(0), env)) }

// ProcsBesideKong is the GOMAXPROCS a plugin server runs with, given the
// one Go chose (cpus: the machine's or its container's CPUs) and the
// GOMAXPROCS environment variable (set: Go's own choice stands). By
// default it is half of cpus, rounded up. Kong runs one nginx worker per
// CPU (nginx_worker_processes = auto), and a busy gateway keeps each
// running; a Go runtime that counts on every CPU as well keeps threads
// spinning for work and waking one another on CPUs the workers hold. A
// plugin server takes about a third of an allowed request's CPU
// (docs/performance.md), so half the CPUs leave it room; on 2 vCPUs the default
// cut the plugin server's CPU per request on a Redis route by a fifth.
// It is set once, at start: Go no longer follows a later change of the
// container's CPU limit.
func ProcsBesideKong(cpus int, env string) int {
	if env != "" {
		return cpus
	}
	return max(1, (cpus+1)/2)
}

// Headers are response headers for SetHeaders, one value each, as the
// Struct kong.response.set_headers takes.
type Headers map[string]*structpb.Value

// Set sets header name to value.
func (h Headers) Set(name, value string) { h[name] = structpb.NewStringValue(value) }

// SetHeaders sets h on Kong's response (kong.response.set_headers), each
// header as one string. go-pdk's SetHeaders wraps every value in a list,
// which both sides pay for on every request: the plugin server building
// and encoding the lists, Kong's worker decoding each into Lua tables
// (pb_rpc.lua's structpb_list) before set_headers reads it.
func SetHeaders(kong *pdk.PDK, h Headers) error {
	return kong.Response.Ask("kong.response.set_headers", &structpb.Struct{Fields: h}, nil)
}
