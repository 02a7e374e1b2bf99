package core_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
)

// Example decides the requests of a net/http handler with a limiter: 2 a
// minute per client address on the memory store, and on a denial the
// rate-limit headers and a 429. README.md and docs/go.md show this code.
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
		if err := limiter.Decide(r.Context(), r.RemoteAddr, 1, &d); err == nil && !d.Allowed {
			headers.Write(w.Header(), &d, headers.Options{Style: headers.Both})
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	})

	for i := 0; i < 3; i++ {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Printf("%d limit %q remaining %q\n", w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 limit "" remaining ""
	// 200 limit "" remaining ""
	// 429 limit "2" remaining "0"
}
