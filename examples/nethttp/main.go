// Command nethttp serves "hello" on :8080 behind tollgate's net/http
// middleware: 5 requests per 10s per client IP (sliding log), stacked with
// 100 per hour, and 20 per minute per X-Api-Key header.
//
//	go run ./examples/nethttp
//	for i in $(seq 7); do curl -si localhost:8080 | head -1; done
package main

import (
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/httplimit"
	"github.com/tollgate/tollgate/core/store/memory"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	flag.Parse()

	store, err := memory.New(memory.Options{MaxKeys: 100_000})
	if err != nil {
		log.Fatal(err)
	}
	perIP, err := core.NewPolicy("per-ip", core.PolicyOptions{},
		algo.Limit{Count: 5, Window: 10 * time.Second, Algorithm: algo.SlidingLog},
		algo.Limit{Count: 100, Window: time.Hour, Algorithm: algo.SlidingCounter})
	if err != nil {
		log.Fatal(err)
	}
	perKey, err := core.NewPolicy("per-key", core.PolicyOptions{},
		algo.Limit{Count: 20, Window: time.Minute, Algorithm: algo.GCRA, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := httplimit.New(httplimit.Config{
		Rules: []httplimit.Rule{
			{Limiter: core.NewLimiter(perIP, store), Key: httplimit.ClientIP},
			{Limiter: core.NewLimiter(perKey, store), Key: httplimit.Header("X-Api-Key")},
		},
		Headers: headers.Options{Style: headers.Both, Jitter: 0.1},
	})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("hello\n"))
	})
	log.Printf("listening on http://%s", *addr)
	log.Fatal(http.ListenAndServe(*addr, limit(hello)))
}
