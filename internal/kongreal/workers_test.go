//go:build kongreal

package kongreal

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/waitfor"
)

// probeWorkers adds to route a post-function plugin that names the worker
// answering each response in X-Probe-Worker, for everyWorker.
func probeWorkers(k *Kong, route string) (id string) {
	k.t.Helper()
	probe := k.AdminWant(201, "POST", "/routes/"+route+"/plugins", map[string]any{"name": "post-function", "config": map[string]any{
		"header_filter": []string{probeWorker}}})
	id, _ = probe["id"].(string)
	return id
}

// probeWorker is the probe's Lua: it names the worker that answered.
const probeWorker = `kong.response.set_header("X-Probe-Worker", "w" .. ngx.worker.id())`

// probes numbers the requests everyWorker sends, so each has a client
// address of its own across a test's calls.
var probes int

// probeClient is a client address no other request of a test uses, for a
// probe that must not spend a key's quota (or be denied by it).
func probeClient() string {
	probes++
	return fmt.Sprintf("X-Forwarded-For: 10.%d.%d.%d", probes>>16&255, probes>>8&255, probes&255)
}

// everyWorker waits until each of k's workers has answered a request to
// path (sent with headers()) with an answer ok takes, and none answers
// otherwise. A config change reaches Kong's workers one by one (each
// rebuilds its plugins within worker_state_update_frequency, 5 s by
// default), and any of them may take the next connection: a few answers
// in a row can all come from the one that has it. The route needs
// probeWorkers.
func everyWorker(t *testing.T, k *Kong, what, path string, headers func() []string, ok func(Answer) bool) {
	t.Helper()
	last := map[string]bool{} // worker → its last answer was ok
	waitfor.TrueEvery(t, 60*time.Second, 50*time.Millisecond, what+" on each of Kong's "+strconv.Itoa(k.workers)+" workers (X-Probe-Worker: the route needs probeWorkers)", func() bool {
		for i := 0; i < 4; i++ {
			a := k.GetOnce(path, headers()...)
			if w := a.Headers.Get("X-Probe-Worker"); w != "" {
				last[w] = ok(a)
			}
		}
		if len(last) < k.workers {
			return false
		}
		for _, good := range last {
			if !good {
				return false
			}
		}
		return true
	})
}

// TestKongPluginServersTakeHalfTheCPUs: each plugin server Kong starts
// runs Go on half the CPUs Go would use, rounded up, unless its
// start_cmd sets GOMAXPROCS, and says which in Kong's log (at info, as
// Kong logs a plugin server's output).
func TestKongPluginServersTakeHalfTheCPUs(t *testing.T) {
	k := Start(t, Options{Env: map[string][]string{"tollgate": {"GOMAXPROCS=3"}}})
	half := (runtime.GOMAXPROCS(0) + 1) / 2
	for name, want := range map[string]int{"tollgate": 3, "tollgate-response": half, "tollgate-response-ratelimiting": half} {
		// Kong's line: "... [<name>:<pid>] <time> listening on <prefix>/<name>.socket, GOMAXPROCS 1, context: ngx.timer".
		line := fmt.Sprintf("/%s.socket, GOMAXPROCS %d,", name, want)
		waitfor.True(t, 10*time.Second, "Kong's log: "+line, func() bool { return strings.Contains(k.ErrorLog(), line) })
	}
}
