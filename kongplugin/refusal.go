package kongplugin

import (
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/Kong/go-pdk"

	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// refusal is an instance whose config the plugin server refused: what
// Kong's schema language cannot say (a window that is not a duration, a
// store that will not open). Kong logs what a plugin server prints at info,
// below its default log level, and an instance that will not start shows
// there only as "starting instance: closed" on every request; so the
// instance starts, and its first request writes the reason to Kong's log
// through kong.log.err ([error], with the request's context). Every
// request is answered as Kong answers a plugin's error: a 500 "An
// unexpected error occurred", rendered by Kong. Unlimited would let a
// config typo switch the limit off.
type refusal struct {
	plugin string // the plugin's name in Kong
	scope  string // route=<id>,service=<id> or ns=<namespace>
	err    error
	told   atomic.Bool
}

// AccessEvent answers a request to a refused instance (see refusal).
func (r *refusal) AccessEvent(kong *pdk.PDK, ev *pluginserver.Event) {
	if !r.told.Swap(true) {
		_ = kong.Log.Err(r.plugin + " (" + r.scope + "): config refused, every request answered 500 until it is fixed: " + r.err.Error())
	}
	fail(ev)
}

// scopeOf names the scope of a raw config, for a config too broken to
// compile.
func scopeOf(raw []byte) string {
	var attached struct {
		RouteID   string `json:"route_id"`
		ServiceID string `json:"service_id"`
		Namespace string `json:"namespace"`
	}
	_ = json.Unmarshal(raw, &attached)
	return instanceScope(attached.RouteID, attached.ServiceID, attached.Namespace).Name
}

// warnings are what a config's compile has to tell Kong's log: what Kong's
// own plugin would refuse or warn about, which tollgate takes. Kong logs
// a plugin server's output at info, below its default level, so the
// instance's first request tells them through kong.log.warn, once.
type warnings struct {
	lines []string
	told  atomic.Bool
}

func (w *warnings) add(format string, args ...any) {
	w.lines = append(w.lines, fmt.Sprintf(format, args...))
}

// tell logs the warnings at [warn] on the first call, prefixed with who
// warns; later calls cost one atomic load.
func (w *warnings) tell(kong *pdk.PDK, who string) {
	if len(w.lines) == 0 || w.told.Load() || w.told.Swap(true) {
		return
	}
	for _, l := range w.lines {
		_ = kong.Log.Warn(who + l)
	}
}

// instanceScope is an instance's scope, made here alone and used by its
// keys, its log lines, the operators' API and the keys command: counters
// are per route and service the plugin is attached to, as Kong's
// (kong/plugins/rate-limiting/policies/init.lua, get_local_key), named
// "route=<id>,service=<id>" (either id empty when absent), unless a
// namespace shares them ("ns=<namespace>"); each key is "<name>|<id>".
func instanceScope(routeID, serviceID, namespace string) gate.Scope {
	name := "route=" + routeID + ",service=" + serviceID
	if namespace != "" {
		name = "ns=" + namespace
	}
	return gate.Scope{Name: name, Prefix: name + "|"}
}
