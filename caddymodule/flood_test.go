package caddymodule_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/procstat"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// raiseFDLimit lifts this process's open-file limit (which Caddy, started
// after, inherits) towards want, up to the hard limit; it returns the
// limit in force.
func raiseFDLimit(t *testing.T, want uint64) uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if l.Cur < want {
		l.Cur = min(want, l.Max)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			t.Fatal(err)
		}
	}
	return l.Cur
}

// shapingCaddy is a Caddy whose policy "shaped" holds each key's requests
// to 100/1s (leaky_bucket, max_delay 1s: 101 places) and answers body.
func shapingCaddy(t *testing.T, limit, body string) *caddyproc.Caddy {
	return caddyproc.Start(t, `
	tollgate {
		policy shaped {
			key {http.request.header.X-Key}
			limit `+limit+`
		}
	}
	respond `+body)
}

// TestCaddyShapingFlood: 500 requests at once to one key (10,000 in
// `make chaos`) through a real Caddy whose policy shapes it with
// leaky_bucket 100/1s and max_delay 1s. Every request is answered: at most
// what max_delay holds waits at any moment (101 places: one now and one
// every 10 ms for 1 s), each allowed request is released on its schedule
// (never early, and late only by the machine's scheduling), and the rest
// are refused at once with a Retry-After.
func TestCaddyShapingFlood(t *testing.T) {
	flood := 500
	if os.Getenv("TOLLGATE_CHAOS") == "long" {
		flood = 10_000
	}
	if got := raiseFDLimit(t, uint64(flood)+512); got < uint64(flood)+512 {
		flood = int(got) - 512 // what this machine allows, said in the log
	}
	c := shapingCaddy(t, "100/1s leaky_bucket max_delay 1s", `"{http.tollgate.decided_at} {http.tollgate.delay}"`)
	rssBefore, _ := procstat.RSS(c.Pid())

	type answer struct {
		sent, answered time.Time
		status         int
		decided        int64 // µs, Caddy's clock
		delay          time.Duration
		retryAfter     string
		err            error
	}
	answers := make([]answer, flood)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: flood}, Timeout: 30 * time.Second}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func(a *answer) {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodGet, c.URL+"/", nil)
			req.Header.Set("X-Key", "flooded")
			a.sent = time.Now()
			resp, err := client.Do(req)
			a.answered = time.Now()
			if a.err = err; err != nil {
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
			if at, delay, ok := strings.Cut(string(body), " "); ok && a.status == 200 {
				a.decided, _ = strconv.ParseInt(at, 10, 64)
				a.delay, _ = time.ParseDuration(delay)
			}
		}(&answers[i])
	}
	close(start)
	wg.Wait()
	rssAfter, _ := procstat.RSS(c.Pid())

	// Each allowed request waits on Caddy from its decision to its
	// release: count how many wait at once, and how late each is.
	type event struct {
		at    int64
		delta int
	}
	var events []event
	allowed, refused, failed := 0, 0, 0
	var late, early time.Duration
	for _, a := range answers {
		switch {
		case a.err != nil:
			failed++
			continue
		case a.status == 429 && a.retryAfter != "":
			refused++
			continue
		case a.status != 200:
			failed++
			continue
		}
		allowed++
		release := a.decided + a.delay.Microseconds()
		events = append(events, event{a.decided, +1}, event{release, -1})
		// Caddy's clock is the wall clock at its start plus monotonic time;
		// so is this one, on the same machine.
		offset := a.answered.Sub(time.UnixMicro(release))
		late, early = max(late, offset), min(early, offset)
	}
	sort.Slice(events, func(i, j int) bool {
		return events[i].at < events[j].at || events[i].at == events[j].at && events[i].delta < events[j].delta
	})
	waiting, most := 0, 0
	for _, e := range events {
		waiting += e.delta
		most = max(most, waiting)
	}
	t.Logf("%d requests at once: %d allowed, %d refused with Retry-After, %d failed; at most %d waiting at once (max_delay holds 101); answered up to %s after their release and %s before it; Caddy RSS %.1f MB before, %.1f MB after",
		flood, allowed, refused, failed, most, late.Round(time.Millisecond), (-early).Round(time.Millisecond),
		float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20))
	if failed != 0 {
		t.Errorf("%d requests failed or were answered neither 200 nor 429 with Retry-After", failed)
	}
	if most > 101 {
		t.Errorf("%d requests waited at once; max_delay 1s at 100/1s holds 101", most)
	}
	// Never before its release (the clocks agree to well under a ms), and
	// late only by scheduling: answered late is mostly this process's
	// own flood of goroutines waiting for a core, 2.1 s with 10,000.
	if early < -5*time.Millisecond || late > 5*time.Second {
		t.Errorf("releases from %s early to %s late", -early, late)
	}
	if allowed < 101 {
		t.Errorf("only %d allowed: the shaper should fill its queue", allowed)
	}
}

// TestCaddyShapingCancelFreesPlaces: with a leaky_bucket queue full, 50
// waiting clients give up; their places come free at once (the operators'
// API reads them back far sooner than the queue drains by itself), and new
// requests take them instead of being refused. The queue drains one place
// every 40 ms (101 places over 4 s): the freed places show above that drain
// for over 2 s, however slowly a loaded machine delivers the cancellations.
func TestCaddyShapingCancelFreesPlaces(t *testing.T) {
	const every = 40 * time.Millisecond
	c := shapingCaddy(t, "100/4s leaky_bucket max_delay 4s", `"ok"`)
	room := func() int {
		_, u := adminCall(t, c, "GET", "/tollgate/keys?policy=shaped&key=q")
		return int(u["limits"].([]any)[0].(map[string]any)["remaining"].(float64))
	}
	type waiter struct {
		cancel   context.CancelFunc
		done     chan int     // the status, or -1
		answered *atomic.Bool // released or refused (set before done)
	}
	send := func() waiter {
		ctx, cancel := context.WithCancel(context.Background())
		w := waiter{cancel, make(chan int, 1), new(atomic.Bool)}
		go func() {
			status := -1
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/", nil)
			req.Header.Set("X-Key", "q")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			w.answered.Store(true)
			w.done <- status
		}()
		return w
	}
	// Fill the queue: what it holds at once, then one more at a time until
	// it has no room. One more goes only once every request sent has been
	// decided (answered, or waiting in one of the places taken), so on a
	// slow machine no burst of requests still on its way is refused when
	// the queue fills.
	var sent []waiter
	for i := 0; i < 101; i++ {
		sent = append(sent, send())
	}
	waitfor.True(t, 10*time.Second, "the queue full", func() bool {
		free := room()
		if free == 0 {
			return true
		}
		answered := 0
		for _, w := range sent {
			if w.answered.Load() {
				answered++
			}
		}
		if answered+101-free >= len(sent) {
			sent = append(sent, send())
		}
		return false
	})
	// The 50 clients still waiting that were sent last (released last: none
	// is out yet) give up.
	var gaveUp []waiter
	for i := len(sent) - 1; i >= 0 && len(gaveUp) < 50; i-- {
		if !sent[i].answered.Load() {
			gaveUp = append(gaveUp, sent[i])
		}
	}
	for _, w := range gaveUp {
		w.cancel()
	}
	began := time.Now()
	// Free places beyond what the queue drains by itself (one every 40 ms)
	// can only be the cancelled clients'.
	var freed, drained int
	waitfor.True(t, 5*time.Second, "the cancelled clients' places coming free", func() bool {
		drained = int(time.Since(began) / every)
		freed = room()
		return freed-drained >= 40
	})
	t.Logf("%d waiting clients gave up: %d places free %s later (the queue drains %d by itself in that time)",
		len(gaveUp), freed, time.Since(began).Round(time.Millisecond), drained)
	allowed := 0
	var fresh []waiter
	for i := 0; i < 40; i++ {
		fresh = append(fresh, send())
	}
	for _, w := range fresh {
		if <-w.done == 200 {
			allowed++
		}
	}
	if allowed != 40 {
		t.Errorf("%d of 40 new requests allowed into the freed places", allowed)
	}
	for _, w := range sent {
		if status := <-w.done; status != 200 && status != 429 && status != -1 {
			t.Errorf("a request answered %d", status)
		}
	}
}
