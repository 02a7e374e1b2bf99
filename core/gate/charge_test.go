package gate

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/usage"
)

// TestServeChargedChargesBeforeTheStatus: a response's charge is taken
// when its status is written, whatever the status (a 200 too), and the
// headers that go out with the status show what the charge left; a
// response that writes no status is charged as 200; a status the rule's
// charge does not price is not charged.
func TestServeChargedChargesBeforeTheStatus(t *testing.T) {
	l := algo.Limit{Count: 1000, Window: time.Hour, Algorithm: algo.SlidingLog, AfterResponse: true}
	p := core.MustPolicy("tokens", core.PolicyOptions{}, l)
	store := memory.MustNew(memory.Options{Clock: &core.ManualClock{Micros: 1_700_000_040_000_000}})
	cost := &ResponseCost{Statuses: [][2]int{{200, 299}}, CostHeader: "X-Usage"}
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store), Charge: cost}},
		Headers: headers.Options{Style: headers.XRateLimit}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		serve func(w http.ResponseWriter) int
		left  string // X-RateLimit-Remaining as the status went out
	}{
		{"200 written", func(w http.ResponseWriter) int {
			w.Header().Set("X-Usage", "150")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("answer"))
			return 0
		}, "850"},
		{"201 written", func(w http.ResponseWriter) int {
			w.Header().Set("X-Usage", "50")
			w.WriteHeader(http.StatusCreated)
			return 0
		}, "800"},
		{"body alone", func(w http.ResponseWriter) int {
			w.Header().Set("X-Usage", "100")
			_, _ = w.Write([]byte("answer"))
			return 0
		}, "700"},
		{"500 not priced", func(w http.ResponseWriter) int {
			w.Header().Set("X-Usage", "100")
			w.WriteHeader(http.StatusInternalServerError)
			return 0
		}, "700"}, // admission takes nothing: the response is what is charged
	} {
		var o Outcome
		in := SameInput{Covered: true, Key: "k", Cost: 1}
		if err := g.Decide(context.Background(), &in, &o); err != nil || !o.Passes() {
			t.Fatalf("%s: passes %v, %v", tc.name, o.Passes(), err)
		}
		rec := httptest.NewRecorder()
		g.WriteHeaders(rec.Header(), &o)
		if err := g.ServeCharged(context.Background(), &o, rec, tc.serve); err != nil {
			t.Fatal(err)
		}
		if got := rec.Result().Header.Get("X-RateLimit-Remaining"); got != tc.left {
			t.Errorf("%s: X-RateLimit-Remaining %q as the status went out, want %s", tc.name, got, tc.left)
		}
	}
}

// TestServeChargedChargesTheBodysTokens: a rule that charges the tokens a
// language model's answer reports takes them when the body ends, whether
// the answer is JSON or a stream written and flushed event by event
// (each event reaching the client as it is written); an answer that
// reports none costs the rule's fixed cost; a status it does not price
// costs nothing.
func TestServeChargedChargesTheBodysTokens(t *testing.T) {
	l := algo.Limit{Count: 1000, Window: time.Hour, Algorithm: algo.SlidingLog, AfterResponse: true}
	p := core.MustPolicy("tokens", core.PolicyOptions{}, l)
	store := memory.MustNew(memory.Options{Clock: &core.ManualClock{Micros: 1_700_000_040_000_000}})
	cost := &ResponseCost{Statuses: [][2]int{{200, 299}}, Usage: usage.Total, Fixed: 100}
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store), Charge: cost}},
		Headers: headers.Options{Style: headers.XRateLimit}})
	if err != nil {
		t.Fatal(err)
	}
	events := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":19,\"total_tokens\":30}}\n\n",
		"data: [DONE]\n\n",
	}
	for _, tc := range []struct {
		name  string
		serve func(w http.ResponseWriter) int
		left  string // X-RateLimit-Remaining of the next request
	}{
		{"json", func(w http.ResponseWriter) int {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`))
			return 0
		}, "988"},
		{"stream", func(w http.ResponseWriter) int {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for i, e := range events {
				_, _ = w.Write([]byte(e))
				http.NewResponseController(w).Flush()
				if rec := w.(interface{ Unwrap() http.ResponseWriter }).Unwrap().(*httptest.ResponseRecorder); rec.Body.Len() == 0 || !rec.Flushed || i == 0 && rec.Body.String() != events[0] {
					t.Errorf("stream: event %d not passed on as written", i)
				}
			}
			return 0
		}, "958"},
		{"no usage", func(w http.ResponseWriter) int {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"error":"cut"}`))
			return 0
		}, "858"},
		{"not priced", func(w http.ResponseWriter) int {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(`{"usage":{"total_tokens":500}}`))
			return 0
		}, "858"},
		// A proxy whose upstream died mid-stream aborts the response with
		// a panic: the answer, cut before its usage, costs Fixed.
		{"cut", func(w http.ResponseWriter) int {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte(events[0]))
			panic(http.ErrAbortHandler)
		}, "758"},
	} {
		var o Outcome
		in := SameInput{Covered: true, Key: "k", Cost: 1}
		if err := g.Decide(context.Background(), &in, &o); err != nil || !o.Passes() {
			t.Fatalf("%s: passes %v, %v", tc.name, o.Passes(), err)
		}
		func() {
			defer func() {
				if r := recover(); r != nil && (tc.name != "cut" || r != http.ErrAbortHandler) {
					t.Fatalf("%s: panicked with %v", tc.name, r)
				}
			}()
			if err := g.ServeCharged(context.Background(), &o, httptest.NewRecorder(), tc.serve); err != nil {
				t.Fatal(err)
			}
		}()
		var next Outcome
		if err := g.Decide(context.Background(), &in, &next); err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		g.WriteHeaders(h, &next)
		if got := h.Get("X-RateLimit-Remaining"); got != tc.left {
			t.Errorf("%s: the next request sees %s remaining, want %s", tc.name, got, tc.left)
		}
	}
}
