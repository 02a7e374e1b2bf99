package caddymodule_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
)

// sample is one request of the load.
type sample struct {
	sent    time.Time
	took    time.Duration
	status  int    // -1: no answer (a transport error)
	store   string // shared or fallback, for an allowed request
	decided int64  // µs, the deciding store's clock
}

// loadRun is a steady load of 8 clients sending one key to a Caddy whose
// site answers "{http.tollgate.store} {http.tollgate.decided_at}".
type loadRun struct {
	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	wg      sync.WaitGroup
}

// startLoad starts the load; finish stops it and returns every request.
func startLoad(c *caddyproc.Caddy, key string) *loadRun {
	l := &loadRun{stop: make(chan struct{})}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 10 * time.Second}
	for g := 0; g < 8; g++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, c.URL+"/", nil)
				req.Header.Set("X-Key", key)
				s := sample{sent: time.Now()}
				resp, err := client.Do(req)
				if err != nil {
					s.status = -1
				} else {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					s.status = resp.StatusCode
					if store, at, ok := strings.Cut(string(b), " "); ok && s.status == 200 {
						s.store = store
						s.decided, _ = strconv.ParseInt(at, 10, 64)
					}
				}
				s.took = time.Since(s.sent)
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// sharedFor is how long Redis has been deciding the load's requests sent
// at or after t: from the first such decision to the last.
func (l *loadRun) sharedFor(t time.Time) time.Duration {
	return l.spanSince(t, func(s *sample) bool { return s.store == "shared" })
}

// answeredFor is how long the load's requests sent at or after t have
// been answered (any status): from the first such answer to the last.
func (l *loadRun) answeredFor(t time.Time) time.Duration {
	return l.spanSince(t, func(s *sample) bool { return s.status > 0 })
}

// spanSince is the time from the first to the last request sent at or
// after t that counts.
func (l *loadRun) spanSince(t time.Time, counts func(*sample) bool) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first, last time.Time
	for i := range l.samples {
		s := &l.samples[i]
		if !counts(s) || s.sent.Before(t) {
			continue
		}
		if first.IsZero() {
			first = s.sent
		}
		last = s.sent
	}
	return last.Sub(first)
}

func (l *loadRun) finish() []sample {
	close(l.stop)
	l.wg.Wait()
	return l.samples
}
