package kongreal

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
)

// Upstream is a service for Kong to proxy to: it answers 200 "ok", or
// what the request's query asks for (status=503; header=Name:value, any
// number of times, each a response header line), and counts requests.
type Upstream struct {
	URL  string
	hits atomic.Int64
}

// Hits is how many requests reached the upstream.
func (u *Upstream) Hits() int64 { return u.hits.Load() }

// StartUpstream starts an Upstream on loopback for test t.
func StartUpstream(t testing.TB) *Upstream {
	t.Helper()
	u := &Upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		q := r.URL.Query()
		for _, h := range q["header"] {
			for i := 0; i < len(h); i++ {
				if h[i] == ':' {
					w.Header().Add(h[:i], h[i+1:])
					break
				}
			}
		}
		status := http.StatusOK
		if s, err := strconv.Atoi(q.Get("status")); err == nil {
			status = s
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("ok\n"))
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}
