//go:build kongreal

package kongreal

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/redistest"
)

// TestKongRedisTrustIsKongs: with ssl_verify, tollgate trusts what Kong
// trusts and nothing else, with no SSL_CERT_FILE: Kong's
// lua_ssl_trusted_certificate naming a private CA verifies a Redis whose
// certificate that CA signed, for Kong's rate-limiting and tollgate alike
// (the same answers, request by request); with Kong's default (`system`)
// both fail to verify it, and answer fault_tolerant false's 500.
func TestKongRedisTrustIsKongs(t *testing.T) {
	up := StartUpstream(t)
	ca := redistest.NewCA(t, t.TempDir(), "kong-trust-test-ca")
	_, addr := redistest.StartTLST(t, ca)
	_, port, _ := strings.Cut(addr, ":")
	portN, _ := strconv.Atoi(port)
	config := map[string]any{"hour": 3, "limit_by": "ip", "policy": "redis", "fault_tolerant": false,
		"redis": map[string]any{"host": "127.0.0.1", "port": portN, "ssl": true, "ssl_verify": true, "server_name": "redis.test", "timeout": 2000}}
	for _, tc := range []struct {
		trusted string
		want    []int
	}{
		{ca.File, []int{200, 200, 200, 429}},
		{"system", []int{500, 500}},
	} {
		t.Run("lua_ssl_trusted_certificate "+tc.trusted, func(t *testing.T) {
			k := Start(t, Options{Extra: append(slices.Clone(realIP), "lua_ssl_trusted_certificate = "+tc.trusted)})
			d := NewDeclarative("/probe-trust")
			s := sides("trust", "rate-limiting", "tollgate")
			addPair(d, up, "trust", s, config, pairOpts{})
			// The response plugin's server reads Kong's trust too.
			rrl := map[string]any{"limits": map[string]any{"video": map[string]any{"hour": 3}}, "policy": "redis", "fault_tolerant": false, "redis": config["redis"]}
			d.AddService(map[string]any{"name": "trust-rrl", "url": up.URL, "routes": []any{map[string]any{"name": "trust-rrl", "paths": []string{"/trust-rrl"},
				"plugins": []any{map[string]any{"name": "tollgate-response-ratelimiting", "config": rrl}}}}})
			k.MustLoad(d)
			notNearEnd(t, time.Hour, 30*time.Second)
			kong, tg := interleave(k, s, len(tc.want), "", "X-Forwarded-For: 198.51.100.7")
			var got []int
			for _, a := range tg {
				got = append(got, a.Status)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("tollgate answered %v, want %v (Kong's rate-limiting: %v)\n%s", got, tc.want, kong, k.logTail(20))
			}
			same(t, kong, tg, nil)
			if a := k.GetOnce("/trust-rrl", "X-Forwarded-For: 198.51.100.7"); a.Status != tc.want[0] {
				t.Errorf("tollgate-response-ratelimiting: %s, want %d", a, tc.want[0])
			}
		})
	}
}
