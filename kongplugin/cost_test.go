package kongplugin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/kongproc"
)

// TestKongEventsAndCallsPerRequest measures what one request costs Kong
// for each kind of config: the socket events (one per phase the plugin
// declares: Kong sends each declared phase of every request on a route
// using the plugin, kong/runloop/plugin_servers/plugin.lua) and the PDK
// calls the plugin makes (each a synchronous round trip on that socket).
// The table it measures is the one in docs/kong.md, word for word.
func TestKongEventsAndCallsPerRequest(t *testing.T) {
	phases := map[string][]string{}
	for _, pkg := range []string{kongproc.PluginPackage, kongproc.ResponsePackage, kongproc.ResponseLimitsPackage} {
		var info struct {
			Plugins []struct {
				Name   string
				Phases []string
			}
		}
		if err := json.Unmarshal(kongproc.DumpOf(t, pkg), &info); err != nil {
			t.Fatal(err)
		}
		phases[pkg] = info.Plugins[0].Phases
	}
	servers := map[string]*kongproc.Server{kongproc.PluginPackage: kongproc.Start(t), kongproc.ResponsePackage: kongproc.StartResponse(t),
		kongproc.ResponseLimitsPackage: kongproc.StartPackage(t, kongproc.ResponseLimitsPackage)}
	video := map[string]any{"video": map[string]any{"minute": 100}}
	usage := http.Header{"X-Kong-Limit": {"video=1"}}
	inFlight := []any{map[string]any{"count": 100, "window": "1m", "algorithm": "in_flight"}}
	rows := []struct {
		what   string
		pkg    string
		config map[string]any
		req    kongproc.Request
		deny   bool // exhaust the limit first: the row is a denial
	}{
		{"`limit_by: ip`", kongproc.PluginPackage, map[string]any{"minute": 100, "limit_by": "ip"}, kongproc.Request{ForwardedIP: "192.0.2.1"}, false},
		{"`limit_by: consumer`, a consumer authenticated", kongproc.PluginPackage, map[string]any{"minute": 100}, kongproc.Request{ForwardedIP: "192.0.2.1", ConsumerID: "c-1"}, false},
		{"`limit_by: consumer`, none authenticated (falls back to credential, then IP)", kongproc.PluginPackage, map[string]any{"minute": 100}, kongproc.Request{ForwardedIP: "192.0.2.1"}, false},
		{"`limit_by: header`", kongproc.PluginPackage, map[string]any{"minute": 100, "limit_by": "header", "header_name": "X-Key"}, kongproc.Request{ForwardedIP: "192.0.2.1", Headers: http.Header{"X-Key": {"k"}}}, false},
		{"`limit_by: ip`, `hide_client_headers: true`", kongproc.PluginPackage, map[string]any{"minute": 100, "limit_by": "ip", "hide_client_headers": true}, kongproc.Request{ForwardedIP: "192.0.2.1"}, false},
		{"plans chosen by `plan_header`", kongproc.PluginPackage, map[string]any{"limit_by": "ip", "plans": []any{map[string]any{"name": "free", "minute": 100}}, "default_plan": "free", "plan_by": "header", "plan_header": "X-Plan"},
			kongproc.Request{ForwardedIP: "192.0.2.1", Headers: http.Header{"X-Plan": {"free"}}}, false},
		{"`limit_by: ip`, denied", kongproc.PluginPackage, map[string]any{"minute": 1, "limit_by": "ip"}, kongproc.Request{ForwardedIP: "192.0.2.1"}, true},
		{"`in_flight` limit, `limit_by: ip`", kongproc.ResponsePackage, map[string]any{"limits": inFlight, "limit_by": "ip"}, kongproc.Request{ForwardedIP: "192.0.2.1"}, false},
		{"`adaptive`, `limit_by: ip`", kongproc.ResponsePackage, map[string]any{"minute": 100, "limit_by": "ip", "algorithm": "gcra", "adaptive": map[string]any{"enabled": true}},
			kongproc.Request{ForwardedIP: "192.0.2.1", Status: 200, Source: "service", UpstreamTime: "0.012"}, false},
		{"`limit_by: ip` on tollgate-response", kongproc.ResponsePackage, map[string]any{"minute": 100, "limit_by": "ip"}, kongproc.Request{ForwardedIP: "192.0.2.1"}, false},
		{"`limit_by: ip`, denied, on tollgate-response", kongproc.ResponsePackage, map[string]any{"minute": 1, "limit_by": "ip"}, kongproc.Request{ForwardedIP: "192.0.2.1", Status: 429, Source: "exit"}, true},
		{"`penalty`, `limit_by: ip`", kongproc.PluginPackage, map[string]any{"minute": 100, "limit_by": "ip", "penalty": map[string]any{"denials": 3, "within": 600, "duration": 3600}},
			kongproc.Request{ForwardedIP: "192.0.2.1"}, false},
		{"`reserve`, `limit_by: ip`", kongproc.PluginPackage, map[string]any{"minute": 100, "limit_by": "ip", "reserve": map[string]any{"share": 0.2, "level": 1, "priority_header": "X-Priority"}},
			kongproc.Request{ForwardedIP: "192.0.2.1", Headers: http.Header{"X-Priority": {"1"}}}, false},
		{"`charge` by `status`, `limit_by: ip`", kongproc.ResponsePackage, map[string]any{"minute": 100, "limit_by": "ip", "charge": map[string]any{"status": []any{"401"}}},
			kongproc.Request{ForwardedIP: "192.0.2.1", Status: 401, Source: "service"}, false},
		{"`charge` by `cost_header`, `limit_by: ip`", kongproc.ResponsePackage, map[string]any{"minute": 100, "limit_by": "ip", "charge": map[string]any{"cost_header": "X-Usage"}},
			kongproc.Request{ForwardedIP: "192.0.2.1", Status: 200, Source: "service", ServiceHeaders: http.Header{"X-Usage": {"3"}}}, false},
		{"`limits: {video: {minute: 100}}`, `limit_by: ip`", kongproc.ResponseLimitsPackage, map[string]any{"limits": video, "limit_by": "ip"},
			kongproc.Request{ForwardedIP: "192.0.2.1", ServiceHeaders: usage}, false},
		{"the same, `hide_client_headers: true`", kongproc.ResponseLimitsPackage, map[string]any{"limits": video, "limit_by": "ip", "hide_client_headers": true},
			kongproc.Request{ForwardedIP: "192.0.2.1", ServiceHeaders: usage}, false},
		{"`limits: {video: {minute: 1}}`, `limit_by: ip`, refused in the response phase", kongproc.ResponseLimitsPackage,
			map[string]any{"limits": map[string]any{"video": map[string]any{"minute": 1}}, "limit_by": "ip"},
			kongproc.Request{ForwardedIP: "192.0.2.1", ServiceHeaders: usage}, true},
		{"the same, `block_on_first_violation: true`, refused in the access phase", kongproc.ResponseLimitsPackage,
			map[string]any{"limits": map[string]any{"video": map[string]any{"minute": 1}}, "limit_by": "ip", "block_on_first_violation": true},
			kongproc.Request{ForwardedIP: "192.0.2.1", ServiceHeaders: usage}, true},
	}
	var table strings.Builder
	table.WriteString("| config | plugin | events | PDK calls |\n| --- | --- | --- | --- |\n")
	for i, row := range rows {
		c := servers[row.pkg].Dial()
		var id int32
		if row.pkg == kongproc.ResponseLimitsPackage {
			row.config["route_id"] = fmt.Sprintf("cost-%d", i) // its own counters
			var err error
			if id, err = c.StartInstance(rrlConfig(row.config)); err != nil {
				t.Fatalf("%s: %v", row.what, err)
			}
		} else {
			row.config["namespace"] = fmt.Sprintf("cost-%d", i)
			id = start(t, c, row.config)
		}
		run := func() (events int, calls []string) {
			req := row.req
			req.Shared = map[string]any{}
			for _, phase := range phases[row.pkg] {
				var res *kongproc.Result
				var err error
				switch phase {
				case "access":
					res, err = c.Access(id, req)
				case "log":
					res, err = c.Log(id, req)
				case "response":
					res, err = c.Response(id, req)
				default:
					t.Fatalf("%s: phase %q", row.what, phase)
				}
				if err != nil {
					t.Fatalf("%s: %s: %v", row.what, phase, err)
				}
				events++
				calls = append(calls, res.Calls...)
				if res.Exited {
					if phase == "access" && (!res.Delayed || len(res.Calls) > 2) {
						t.Errorf("%s: a denial in the access phase: delayed %v, %d PDK calls %v; want a delayed response in at most two (the key's and set_ctx)", row.what, res.Delayed, len(res.Calls), res.Calls)
					}
					if !res.Delayed {
						c = servers[row.pkg].Dial() // kong.response.exit ends the connection, as in Kong
					}
					if phase == "access" && row.pkg == kongproc.ResponseLimitsPackage {
						return events, calls // an exit in access: Kong does not proxy, no response phase
					}
					// Kong's log phase still follows an exit.
				}
			}
			return events, calls
		}
		if row.deny {
			run()
		}
		events, calls := run()
		names := make([]string, len(calls))
		for i, call := range calls {
			names[i] = "`" + strings.TrimPrefix(call, "kong.") + "`"
		}
		plugin := "tollgate"
		switch row.pkg {
		case kongproc.ResponsePackage:
			plugin = "tollgate-response"
		case kongproc.ResponseLimitsPackage:
			plugin = "tollgate-response-ratelimiting"
		}
		fmt.Fprintf(&table, "| %s | %s | %d | %d: %s |\n", row.what, plugin, events, len(calls), strings.Join(names, ", "))
		c.Close()
	}
	t.Logf("\n%s", table.String())
	doc, err := os.ReadFile("../docs/kong.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), table.String()) {
		t.Errorf("docs/kong.md does not hold the measured table:\n%s", table.String())
	}
}
