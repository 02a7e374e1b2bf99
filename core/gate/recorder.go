package gate

import (
	"net/http"

	"github.com/tollgate/tollgate/core"
)

// ServeObserved serves a request the outcome passed through serve and
// reports the upstream's status and how long it took to the adaptive
// rules that let it through (Observe). serve returns the status to count
// when the upstream failed without answering (a handler's error), or 0 to
// count the status written: 200 when nothing was.
func (p *Outcome) ServeObserved(w http.ResponseWriter, serve func(w http.ResponseWriter) (failed int)) {
	rec := &statusRecorder{ResponseWriter: w}
	began := core.MonotonicNow()
	status := serve(rec)
	took := core.MonotonicNow() - began
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
}

// WriteHeader remembers the first final (non-1xx) status.
func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write remembers 200 when no status was written.
func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
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
