package core_test

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
)

// Example decides the requests of a net/http handler with a limiter: 2 a
// minute per client address (each request below comes on a connection of
// its own, from one client) on the memory store, with the rate-limit
// headers on every response and a 429 on a denial. README.md and docs/go.md show this code.
func Example() {
	store := memory.MustNew(memory.Options{MaxKeys: 100_000})
	policy, err := core.NewPolicy("api", core.PolicyOptions{},
		algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.SlidingCounter})
	if err != nil {
		log.Fatal(err) // errors name the policy, the limit and the field
	}
	limiter := core.NewLimiter(policy, store)

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var d core.Decision
		client, _, _ := net.SplitHostPort(r.RemoteAddr) // without the port: one key per client, not per connection
		if err := limiter.Decide(r.Context(), client, 1, &d); err != nil {
			// The memory store never fails; Redis can: failover.New keeps a limit
			// then, and httplimit logs each outage once.
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		headers.Write(w.Header(), &d, headers.Options{Style: headers.Both}) // on every response
		if !d.Allowed {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	})

	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = fmt.Sprintf("192.0.2.1:%d", 50000+i) // a connection of its own each time
		handler.ServeHTTP(w, req)
		fmt.Printf("%d limit %q remaining %q\n", w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 limit "2" remaining "1"
	// 200 limit "2" remaining "0"
	// 429 limit "2" remaining "0"
}
