package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/httplimit"
	"github.com/tollgate/tollgate/core/store/memory"
)

// ExampleNew limits each API key to 2 requests a minute. Every response
// carries the rate-limit headers, allowed or not; a request without the
// key is counted under its client address (spec.EmptyKeyClient, the
// default), so leaving the header out gets no client past the limit.
func ExampleNew() {
	store := memory.MustNew(memory.Options{})
	policy, err := core.NewPolicy("api", core.PolicyOptions{},
		algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := httplimit.New(httplimit.Config{
		Rules:   []httplimit.Rule{{Limiter: core.NewLimiter(policy, store), Key: httplimit.Header("X-API-Key")}},
		Headers: headers.Options{Style: headers.XRateLimit},
	})
	if err != nil {
		log.Fatal(err) // errors name the rule and the field
	}
	handler := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))

	send := func(apiKey string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.7:41000"
		if apiKey != "" {
			r.Header.Set("X-API-Key", apiKey)
		}
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Printf("key %-7q %d limit %s remaining %s\n", apiKey, w.Code,
			w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
	}
	send("alice")
	send("alice")
	send("alice") // over alice's 2 a minute
	send("")      // no key: the client address's own bucket
	send("")
	send("")
	// Output:
	// key "alice" 200 limit 2 remaining 1
	// key "alice" 200 limit 2 remaining 0
	// key "alice" 429 limit 2 remaining 0
	// key ""      200 limit 2 remaining 1
	// key ""      200 limit 2 remaining 0
	// key ""      429 limit 2 remaining 0
}
