package core

import "net/http"

// StatusRecorder is an http.ResponseWriter that remembers the status the
// upstream's handler wrote, for Plan.Observe.
type StatusRecorder struct {
	http.ResponseWriter
	// Status is the first final status written: 0 until a header or body
	// is written, then 200 unless WriteHeader said otherwise.
	Status int
}

// WriteHeader remembers the first final (non-1xx) status.
func (s *StatusRecorder) WriteHeader(code int) {
	if s.Status == 0 && code >= 200 {
		s.Status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write remembers 200 when no status was written.
func (s *StatusRecorder) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *StatusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Answered is the status the client got: Status, or 200 when the handler
// wrote nothing (net/http then sends 200).
func (s *StatusRecorder) Answered() int {
	if s.Status == 0 {
		return http.StatusOK
	}
	return s.Status
}
