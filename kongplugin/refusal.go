package kongplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Kong/go-pdk"

	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// refusal is an instance whose config the plugin server refused: what
// Kong's schema language cannot say (limits out of range together, a
// store that will not open). Kong logs what a plugin server prints at
// info, below its default log level, and an instance that will not start
// shows there only as "starting instance: closed" on every request; so the
// instance starts, and its first request writes the reason to Kong's log
// through kong.log.err ([error], with the request's context). Every
// request is answered as Kong answers a plugin's error: a 500 "An
// unexpected error occurred", rendered by Kong. Unlimited would let a
// config typo switch the limit off.
//
// A refusal the world caused (a file the server may not read, a database
// or Redis it cannot reach) heals: it tries the start again in the
// background, and once it starts, the instance serves, with no config
// change (see healing).
type refusal struct {
	plugin string // the plugin's name in Kong
	scope  string // route=<id>,service=<id> or ns=<namespace>
	err    error
	told   atomic.Bool
	heal   *healing // nil for the config's own error, which only a new config mends
}

// attempt starts an instance once: the started config, or the scope to
// name and the error.
type attempt func() (inst any, scope string, err error)

// startOrRefuse starts an instance with try, or returns a refusal of it
// (which heals when the world caused it).
func startOrRefuse(plugin string, try attempt) (any, error) {
	inst, scope, err := try()
	if err == nil {
		return inst, nil
	}
	r := &refusal{plugin: plugin, scope: scope, err: err}
	if causedByTheWorld(err) {
		r.heal = startHealing(try, err)
	}
	return r, nil
}

// causedByTheWorld reports whether err came from outside the config: a
// file or socket the server could not use, an address it could not reach.
func causedByTheWorld(err error) bool {
	var path *fs.PathError
	var op *net.OpError
	var dns *net.DNSError
	var missing *missingKongFile
	return errors.As(err, &path) || errors.As(err, &op) || errors.As(err, &dns) || errors.As(err, &missing) ||
		errors.Is(err, context.DeadlineExceeded)
}

// missingKongFile is a file Kong writes under its prefix that is not
// there (yet): the world, not the config.
type missingKongFile struct{ path, what string }

func (e *missingKongFile) Error() string { return e.path + ", " + e.what + ", is missing" }

// who names the instance in Kong's log.
func (r *refusal) who() string { return r.plugin + " (" + r.scope + "): " }

// AccessEvent answers a request to a refused instance (see refusal), or
// passes it to the instance a healed refusal started.
func (r *refusal) AccessEvent(kong *pdk.PDK, ev *pluginserver.Event) {
	if r.heal != nil {
		inst, reason, changed := r.heal.state()
		switch {
		case inst != nil:
			if changed && r.told.Load() {
				_ = kong.Log.Notice(r.who() + "config in force again: what refused it is mended")
			}
			if a, ok := inst.(interface {
				AccessEvent(*pdk.PDK, *pluginserver.Event)
			}); ok {
				a.AccessEvent(kong, ev)
			}
			return
		case changed && r.told.Load():
			_ = kong.Log.Err(r.who() + "config still refused, for another reason: " + reason.Error())
		}
	}
	if !r.told.Swap(true) {
		how := "every request answered 500 until it is fixed: "
		if r.heal != nil {
			how = "every request answered 500 until the cause is gone (tried again every " + healingMaxWait.String() + " at most, no config change needed): "
		}
		_ = kong.Log.Err(r.who() + "config refused, " + how + r.err.Error())
	}
	fail(ev)
}

// Response passes the response event to the instance a healed refusal
// started; a refused instance has nothing to do with it.
func (r *refusal) Response(kong *pdk.PDK) {
	if inst := r.healed(); inst != nil {
		if h, ok := inst.(interface{ Response(*pdk.PDK) }); ok {
			h.Response(kong)
		}
	}
}

// Log passes the log event to the instance a healed refusal started.
func (r *refusal) Log(kong *pdk.PDK) {
	if inst := r.healed(); inst != nil {
		if h, ok := inst.(interface{ Log(*pdk.PDK) }); ok {
			h.Log(kong)
		}
	}
}

// healed is the instance a healed refusal started, nil before; it leaves
// what AccessEvent tells Kong's log untold.
func (r *refusal) healed() any {
	if r.heal == nil {
		return nil
	}
	r.heal.mu.Lock()
	defer r.heal.mu.Unlock()
	return r.heal.inst
}

// Close stops the healing and closes the instance it started, if any:
// Kong closes a refused instance too when its config changes.
func (r *refusal) Close() {
	if r.heal != nil {
		r.heal.close()
	}
}

// healingMaxWait bounds the wait between two tries of a healing refusal;
// the first comes after a second, each later one twice as late.
const healingMaxWait = 30 * time.Second

// healing tries a refused start again, in the background, until it
// starts, the refusal turns out to be the config's own, or Kong closes the
// instance.
type healing struct {
	try  attempt
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	inst   any   // the started instance, once started
	reason error // the latest refusal's reason
	seen   int   // reasons and the start, counted
	told   int   // of them, told to Kong's log
}

func startHealing(try attempt, reason error) *healing {
	h := &healing{try: try, stop: make(chan struct{}), done: make(chan struct{}), reason: reason}
	go h.run()
	return h
}

func (h *healing) run() {
	defer close(h.done)
	wait := time.Second
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		inst, _, err := h.try()
		h.mu.Lock()
		select {
		case <-h.stop: // closed while it tried
			h.mu.Unlock()
			closeInstance(inst)
			return
		default:
		}
		if err == nil {
			h.inst = inst
			h.seen++
			h.mu.Unlock()
			log.Printf("instance started on a later try: what refused it is mended")
			return
		}
		if err.Error() != h.reason.Error() {
			h.reason = err
			h.seen++
		}
		h.mu.Unlock()
		if !causedByTheWorld(err) {
			return // the config's own error now: only a new config mends it
		}
		wait = min(2*wait, healingMaxWait)
		t.Reset(wait)
	}
}

// state returns the started instance (nil while refused), the latest
// reason, and whether either changed since the last call that saw it.
func (h *healing) state() (inst any, reason error, changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	changed = h.told != h.seen
	h.told = h.seen
	return h.inst, h.reason, changed
}

func (h *healing) close() {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	inst := h.inst
	h.inst = nil
	h.mu.Unlock()
	closeInstance(inst)
}

// closeInstance gives back what a started instance holds.
func closeInstance(inst any) {
	if c, ok := inst.(interface{ Close() }); ok {
		c.Close()
	}
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
