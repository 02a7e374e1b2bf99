// Package pdklog keeps one line of go-pdk's per-connection errors out of
// Kong's log per denial. Kong 3.9.3 ends a plugin server connection in the
// middle of an event whenever the plugin calls kong.response.exit (the
// exit ends the request's Lua thread inside the bridge loop, before the
// connection is put back in the pool:
// kong/runloop/plugin_servers/rpc/pb_rpc.lua, Rpc:call), and go-pdk then
// logs the failed write of the event's last frames. Kong writes a plugin
// server's output to its error log, so a denial flood became a log flood.
package pdklog

import (
	"io"
	"regexp"
	"sync"
	"sync/atomic"
)

// connectionEnded matches a line the standard logger writes for go-pdk's
// servePb when its connection was ended under it: the date and time, then
// a Unix socket read or write error, or EOF.
var connectionEnded = regexp.MustCompile(`^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (((read|write) unix \S*: (use of closed network connection|broken pipe|connection reset by peer))|EOF|unexpected EOF)\n?$`)

// Notice is the line written in place of the first line dropped.
const Notice = "tollgate: Kong ended a plugin server connection mid-event (it does after every kong.response.exit, a denial's answer); go-pdk's error lines for such connections are not logged\n"

// Writer passes each line to its output but go-pdk's lines for
// connections Kong ended: the first becomes Notice, the others are
// counted. The standard logger writes one line per Write.
type Writer struct {
	out     io.Writer
	mu      sync.Mutex
	noticed bool
	dropped atomic.Int64
}

// New returns a Writer writing to out.
func New(out io.Writer) *Writer { return &Writer{out: out} }

// Write writes p unless it is one of go-pdk's lines for an ended
// connection; it always reports p as written.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if connectionEnded.Match(p) {
		w.dropped.Add(1)
		if w.noticed {
			return len(p), nil
		}
		w.noticed = true
		_, err := io.WriteString(w.out, Notice)
		return len(p), err
	}
	_, err := w.out.Write(p)
	return len(p), err
}

// Dropped is how many lines Write kept out of the output.
func (w *Writer) Dropped() int64 { return w.dropped.Load() }
