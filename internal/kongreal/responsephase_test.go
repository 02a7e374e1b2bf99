//go:build kongreal

package kongreal

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/waitfor"
)

// adminSocket is a client of a plugin server's operators' API on its Unix
// socket.
type adminSocket struct {
	c *http.Client
}

func newAdminSocket(t *testing.T, path string) *adminSocket {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &adminSocket{c: &http.Client{Transport: tr}}
}

// get decodes the API's answer to GET /tollgate/<path>?<q>.
func (a *adminSocket) get(t *testing.T, path string, q url.Values, out any) {
	t.Helper()
	resp, err := a.c.Get("http://tollgate/tollgate/" + path + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s %v: %d %v", path, q, resp.StatusCode, err)
	}
}

// used is how many units key has used of policy's first limit.
func (a *adminSocket) used(t *testing.T, policy, key string) int64 {
	t.Helper()
	var u struct{ Limits []struct{ Used int64 } }
	a.get(t, "keys", url.Values{"policy": {policy}, "key": {key}}, &u)
	if len(u.Limits) == 0 {
		t.Fatalf("keys %s %s: no limits", policy, key)
	}
	return u.Limits[0].Used
}

// effectiveCount is the count policy's first limit admits now (an
// adaptive limit's count times its factor).
func (a *adminSocket) effectiveCount(t *testing.T, policy string) float64 {
	t.Helper()
	var ps []struct {
		Name   string
		Limits []struct {
			EffectiveCount float64 `json:"effective_count"`
		}
	}
	a.get(t, "policies", nil, &ps)
	for _, p := range ps {
		if p.Name == policy && len(p.Limits) > 0 {
			return p.Limits[0].EffectiveCount
		}
	}
	t.Fatalf("policies: no %s in %+v", policy, ps)
	return 0
}

// kongErrors are the lines of Kong's log since before that say a Lua
// thread died or the plugin server failed.
func kongErrors(k *Kong, before string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimPrefix(k.ErrorLog(), before), "\n") {
		if strings.Contains(l, "[error]") || strings.Contains(l, "thread aborted") || strings.Contains(l, "API disabled") {
			out = append(out, l)
		}
	}
	return out
}

// TestKongResponsePhase runs in real Kong what tollgate-response does
// after the response (Kong's log phase, which a Go plugin gets in a
// timer): a cost the upstream reports in a header, charges by status,
// in-flight slots given back (also when the client went away), and an
// adaptive limit that reads the upstream's status and time, with no Lua
// error in Kong's log.
func TestKongResponsePhase(t *testing.T) {
	up := StartUpstream(t)
	socket := filepath.Join(t.TempDir(), "admin.sock")
	k := Start(t, Options{Extra: realIP, Env: map[string][]string{"tollgate-response": {"TOLLGATE_ADMIN_SOCKET=" + socket}}})
	d := NewDeclarative("/probe-response-phase")
	route := func(name string, config map[string]any) {
		d.AddService(map[string]any{"name": name, "url": up.URL, "routes": []any{map[string]any{"name": name, "paths": []string{"/" + name},
			"plugins": []any{map[string]any{"name": "tollgate-response", "config": config}}}}})
	}
	route("cost", map[string]any{"limit_by": "ip", "limits": []any{map[string]any{"count": 1000, "window": "1h"}}, "charge": map[string]any{"cost_header": "X-Usage"}})
	route("failures", map[string]any{"limit_by": "ip", "limits": []any{map[string]any{"count": 3, "window": "1h"}}, "charge": map[string]any{"status": []string{"401"}}})
	route("slots", map[string]any{"limit_by": "ip", "limits": []any{map[string]any{"count": 2, "window": "1m", "algorithm": "in_flight"}}}) // window: the lease
	route("adaptive", map[string]any{"limit_by": "ip", "second": 200, "algorithm": "gcra", "adaptive": map[string]any{"min": 0.1}})
	k.MustLoad(d)
	admin := newAdminSocket(t, socket)
	before := k.ErrorLog()
	scope := func(name string) string { return fmt.Sprintf("route=%s,service=", k.ID("routes", name)) }

	t.Run("a cost reported in a header", func(t *testing.T) {
		const client = "198.51.100.100"
		var statuses []int
		for i := 0; i < 9; i++ {
			a := k.Get("/cost"+usage("X-Usage:150"), "X-Forwarded-For: "+client)
			statuses = append(statuses, a.Status)
			if a.Status == 200 { // charged after the response, in Kong's log phase
				want := min(int64(150*(i+1)), 1000) // the API shows an overdrawn limit as used up
				waitfor.True(t, 10*time.Second, fmt.Sprintf("%d used after %d responses", want, i+1), func() bool { return admin.used(t, scope("cost"), client) >= want })
			}
		}
		// 1000 an hour, 150 a call: the 7th overdraws (1050), the 8th is refused.
		if fmt.Sprint(statuses) != "[200 200 200 200 200 200 200 429 429]" {
			t.Errorf("statuses %v, want seven 200s then 429s", statuses)
		}
	})
	t.Run("charged by status", func(t *testing.T) {
		const client = "198.51.100.101"
		var statuses []int
		for i, status := range []int{200, 401, 200, 401, 401, 200, 401} {
			a := k.Get(fmt.Sprintf("/failures?status=%d", status), "X-Forwarded-For: "+client)
			statuses = append(statuses, a.Status)
			if i < 5 {
				want := map[int]int64{0: 0, 1: 1, 2: 1, 3: 2, 4: 3}[i]
				waitfor.True(t, 10*time.Second, fmt.Sprintf("%d charged", want), func() bool { return admin.used(t, scope("failures"), client) == want })
			}
		}
		// Three 401s charge the 3 of the hour; then every request is refused.
		if fmt.Sprint(statuses) != "[200 401 200 401 401 429 429]" {
			t.Errorf("statuses %v, want the three 401s charged and then 429s", statuses)
		}
	})
	t.Run("in-flight slots", func(t *testing.T) {
		const client = "198.51.100.102"
		var wg sync.WaitGroup
		results := make([]int, 2)
		ctx, cancel := context.WithCancel(context.Background())
		for i := range results {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, k.ProxyURL+"/slots?hold=slots", nil)
				req.Header.Set("X-Forwarded-For", client)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					results[i] = resp.StatusCode
					resp.Body.Close()
				}
			}(i)
		}
		waitfor.True(t, 10*time.Second, "two requests held by the upstream", func() bool { return up.Holding.Load() == 2 })
		if a := k.Get("/slots", "X-Forwarded-For: "+client); a.Status != 429 {
			t.Errorf("a third request while two are in flight: %s, want 429", a)
		}
		// The clients go away: Kong ends the requests, its log phase runs,
		// the slots come back.
		cancel()
		wg.Wait()
		waitfor.True(t, 10*time.Second, "the upstream's held requests ended", func() bool { return up.Holding.Load() == 0 })
		waitfor.True(t, 10*time.Second, "the slots back after the clients left", func() bool {
			return k.Get("/slots", "X-Forwarded-For: "+client).Status == 200
		})
		up.Release("slots")
	})
	t.Run("adaptive limits follow the upstream", func(t *testing.T) {
		k.Get("/adaptive", "X-Forwarded-For: 198.51.100.109") // the instance starts at its first request
		start := admin.effectiveCount(t, scope("adaptive"))
		waitfor.TrueEvery(t, 30*time.Second, 20*time.Millisecond, "the adaptive limit cut by the upstream's 503s", func() bool {
			for i := 0; i < 10; i++ {
				k.Get("/adaptive?status=503", fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", 110+i%10))
			}
			return admin.effectiveCount(t, scope("adaptive")) < start/2
		})
	})
	if errs := kongErrors(k, before); len(errs) > 0 {
		t.Errorf("Kong's log has %d errors:\n%s", len(errs), strings.Join(errs[:min(len(errs), 10)], "\n"))
	}
}
