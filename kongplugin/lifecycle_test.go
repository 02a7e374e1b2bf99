package kongplugin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// TestInstanceLifecycle: an instance opens its store and registers with
// the operators' API when Kong starts it, and gives both back when Kong
// closes it. Kong starts a config's new instance before it closes the old
// one (kong/runloop/plugin_servers/plugin.lua, get_instance_id), so a new
// config of the same store keeps every counter; the last close closes
// the store.
func TestInstanceLifecycle(t *testing.T) {
	before := openstore.Live()
	start := func(minute int) *Config {
		t.Helper()
		raw, _ := json.Marshal(map[string]any{"minute": minute, "limit_by": "ip", "namespace": "lifecycle", "__seq__": minute})
		inst, err := AccessOnly.start(raw)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := inst.(*Config)
		if !ok {
			t.Fatalf("minute %d: started %T (%v), want a config", minute, inst, inst)
		}
		return c
	}
	remaining := func(c *Config) int64 {
		t.Helper()
		var o gate.Outcome
		req := gate.SameInput{Covered: true, Key: c.compiled.scope.Key("192.0.2.1"), Cost: 1}
		if err := c.compiled.gate.Decide(context.Background(), &req, &o); err != nil {
			t.Fatal(err)
		}
		return o.Decision.Remaining
	}
	registered := func() bool {
		rec := httptest.NewRecorder()
		admin.Handler("/").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/policies", nil))
		return strings.Contains(rec.Body.String(), `"ns=lifecycle"`)
	}
	old := start(5)
	remaining(old)
	remaining(old)
	if openstore.Live() != before+1 || !registered() {
		t.Fatalf("started: %d stores open (was %d), registered %v", openstore.Live(), before, registered())
	}
	renewed := start(6) // a new config of the same store, started before the old one closes
	old.Close()
	if got := remaining(renewed); got != 3 {
		t.Errorf("after the config change: %d left of 6, want 3 (the old instance's 2 kept)", got)
	}
	if openstore.Live() != before+1 || !registered() {
		t.Errorf("the old instance closed: %d stores open, registered %v; want the store and the entry kept", openstore.Live(), registered())
	}
	renewed.Close()
	if openstore.Live() != before || registered() {
		t.Errorf("every instance closed: %d stores open (was %d), registered %v; want none left", openstore.Live(), before, registered())
	}
}
