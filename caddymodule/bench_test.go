package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core"
)

// BenchmarkServeHTTP measures the handler in-process (no network): the
// per-request cost tollgate adds to Caddy, allowed requests on 100k keys.
func BenchmarkServeHTTP(b *testing.B) {
	for _, alg := range []string{"sliding_counter", "sliding_log"} {
		b.Run(alg, func(b *testing.B) {
			var h Handler
			h.Policies = []*PolicyConfig{{PolicySpec: core.PolicySpec{Name: "p", Key: "{http.request.header.X-Key}",
				Limits: []core.LimitSpec{{Count: 100_000, Window: core.Duration(60e9), Algorithm: alg}}}}}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := h.Provision(ctx); err != nil {
				b.Fatal(err)
			}
			defer h.Cleanup()
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
			keys := make([]string, 100_000)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := req.Clone(req.Context())
				r.Header = http.Header{"X-Key": {keys[i%len(keys)]}}
				r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
				clear(w.Header())
				if err := h.ServeHTTP(w, r, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
