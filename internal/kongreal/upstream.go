package kongreal

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
)

// Upstream is a service for Kong to proxy to: it answers 200 "ok", or
// what the request's query asks for (status=503; header=Name:value, any
// number of times, each a response header line; hold=NAME, to answer only
// once Release(NAME) is called), and counts requests.
type Upstream struct {
	URL  string
	hits atomic.Int64
	mu   sync.Mutex
	held map[string]chan struct{}
	// Holding is how many requests wait in hold now.
	Holding atomic.Int64
}

// gate returns the channel requests held under name wait on.
func (u *Upstream) gate(name string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.held == nil {
		u.held = map[string]chan struct{}{}
	}
	if u.held[name] == nil {
		u.held[name] = make(chan struct{})
	}
	return u.held[name]
}

// Release answers every request held under name, now and later.
func (u *Upstream) Release(name string) { close(u.gate(name)) }

// Hits is how many requests reached the upstream.
func (u *Upstream) Hits() int64 { return u.hits.Load() }

// StartUpstream starts an Upstream on loopback for test t.
func StartUpstream(t T) *Upstream {
	t.Helper()
	u := &Upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		q := r.URL.Query()
		if name := q.Get("hold"); name != "" {
			u.Holding.Add(1)
			select {
			case <-u.gate(name):
			case <-r.Context().Done(): // the client (Kong) went away
			}
			u.Holding.Add(-1)
		}
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

// StartGRPCUpstream starts, for test t, a gRPC service on loopback over
// HTTP/2 without TLS (Kong's grpc:// services): every call gets one empty
// message and grpc-status 0, whatever the method. It returns its URL for
// a Kong service (grpc://127.0.0.1:<port>) and counts calls.
func StartGRPCUpstream(t T) (url string, calls *atomic.Int64) {
	t.Helper()
	calls = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte{0, 0, 0, 0, 0}) // uncompressed, length 0: an empty message
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set("Grpc-Message", "")
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return "grpc://" + srv.Listener.Addr().String(), calls
}
