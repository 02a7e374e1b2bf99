package gate

import (
	"net/http"
	"time"

	"github.com/tollgate/tollgate/core"
)

// ServeObserved serves a request the outcome passed through serve and
// reports the upstream's status and latency to the adaptive rules that let
// it through (Observe). serve returns the status to count when the upstream
// failed without answering (a handler's error), or 0 to count the status
// written: 200 when nothing was; and the upstream's latency when the
// adapter knows it (a proxy's time to the upstream's response header), or
// 0. Without it the latency is the time to the response's first byte, not
// to its last: a body streamed to a slow client is the client's time, not
// the upstream's.
func (p *Outcome) ServeObserved(w http.ResponseWriter, serve func(w http.ResponseWriter) (failed int, upstream time.Duration)) {
	rec := &statusRecorder{ResponseWriter: w, began: core.MonotonicNow()}
	status, took := serve(rec)
	if took <= 0 {
		took = rec.firstByte
		if took <= 0 { // nothing written: the whole time
			took = core.MonotonicNow() - rec.began
		}
	}
	if status == 0 {
		status = rec.answered()
	}
	p.Observe(status, took)
}

// statusRecorder is an http.ResponseWriter that remembers the status the
// upstream's handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int // the first final status written; 0 until then
	// began is when serving started, and firstByte how long after it the
	// first final status or byte was written (0 until then), on
	// core.MonotonicNow's clock.
	began, firstByte time.Duration
}

// wrote notes the time of the first final status or byte.
func (s *statusRecorder) wrote() {
	if s.firstByte == 0 {
		s.firstByte = max(1, core.MonotonicNow()-s.began)
	}
}

// WriteHeader remembers the first final (non-1xx) status.
func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
		s.wrote()
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write remembers 200 when no status was written.
func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
		s.wrote()
	}
	return s.ResponseWriter.Write(b)
}

// Flush sends what was written so far (a 200 header when nothing was), for
// a handler that asks its writer for http.Flusher, as streaming ones do.
func (s *statusRecorder) Flush() {
	if s.status == 0 {
		s.status = http.StatusOK
		s.wrote()
	}
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// answered is the status the client got: 200 when the handler wrote
// nothing (net/http then sends 200).
func (s *statusRecorder) answered() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}
