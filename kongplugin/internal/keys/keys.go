// Package keys is the plugin server's keys command: it reads and resets a
// key's usage in Redis from a plugin's config as Kong's Admin API returns
// it, or asks a running plugin server over its admin socket
// (admin.SocketEnv) for that, the policies in force and the keys denied
// most.
package keys

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// Target is a plugin config's policies over their store, as the keys
// command reaches them without a running gateway (Kong's plugin config,
// compiled).
type Target struct {
	// Scope is the config's: its Name names the config's policy in
	// answers (with several policies, each is Name,policy=<its name>, as
	// the admin socket names them), and the keys operators give are read
	// in it.
	Scope gate.Scope
	// Policies are the config's policies: one, or one per resource, of
	// which --policy <name> picks one (the first by default).
	// Policies are compiled for Store (config.Compile checked each against it).
	Policies []*core.Policy
	Store    openstore.Config
}

// Usage is the keys command's help.
const Usage = `usage:
  keys show  --plugin FILE --key KEY [--plan PLAN]    a key's usage in each limit, read from its store
  keys reset --plugin FILE --key KEY [--limit LIMIT]  forget a key's usage (every limit, or one)
             [--policy NAME]                          with --plugin, a config of several policies'
                                                      (response-ratelimiting's resources) one
             [--kong-prefix DIR]                      with --plugin, the Kong whose settings the
                                                      store takes: policy cluster's database,
                                                      ssl_verify's trusted CAs (none by default)
  keys show|reset|top|policies --socket PATH [--policy NAME] ...
                                                     the same, and the keys denied most, asked of a
                                                     running server started with ` + admin.SocketEnv + `=PATH
FILE is the plugin as Kong's Admin API returns it (GET /plugins/{id}) or its
config alone, JSON; KEY is the identifier limit_by names (a consumer id, an
IP address, a header's value). Answers are JSON, keys hashed unless shown in
clear; the exit status is 1 when the store or server refuses, 2 on bad usage.
`

// Open compiles a plugin file's bytes into a Target, for the Kong whose
// prefix is kongPrefix ("": none; its settings are not read).
type Open func(kongPrefix string, config []byte) (Target, error)

// Run runs the keys command with args (after "keys"); open compiles the
// plugin file. It returns the exit status.
func Run(args []string, stdout, stderr io.Writer, open Open) int {
	fs := flag.NewFlagSet("keys", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	plugin := fs.String("plugin", "", "")
	socket := fs.String("socket", "", "")
	kongPrefix := fs.String("kong-prefix", "", "")
	q := url.Values{}
	for _, name := range []string{"policy", "key", "plan", "limit"} {
		fs.Func(name, "", func(v string) error { q.Set(name, v); return nil })
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, Usage)
		return 2
	}
	op := args[0]
	call, ok := map[string]struct{ method, path string }{"show": {"GET", "keys"}, "reset": {"DELETE", "keys"},
		"top": {"GET", "top"}, "policies": {"GET", "policies"}}[op]
	if !ok {
		fmt.Fprintf(stderr, "keys: unknown subcommand %q\n%s", op, Usage)
		return 2
	}
	method, path := call.method, call.path
	var wrong string
	switch err := fs.Parse(args[1:]); {
	case err != nil:
		wrong = err.Error()
	case fs.NArg() > 0:
		wrong = fmt.Sprintf("%q is not a flag (flags only)", fs.Arg(0))
	case *plugin == "" && *socket == "":
		wrong = "give --plugin or --socket (--plugin FILE: the plugin's config as Kong stores it; --socket PATH: a running plugin server's)"
	case *plugin != "" && *socket != "":
		wrong = "give --plugin or --socket, not both"
	}
	if wrong != "" {
		fmt.Fprintf(stderr, "keys %s: %s\n%s", op, wrong, Usage)
		return 2
	}
	if *kongPrefix != "" && *socket != "" {
		fmt.Fprintf(stderr, "keys %s: --kong-prefix goes with --plugin: a server started by Kong knows its Kong\n%s", op, Usage)
		return 2
	}
	// Each subcommand takes its own flags: one it would ignore is refused.
	takes := map[string][]string{"show": {"policy", "key", "plan"}, "reset": {"policy", "key", "limit"},
		"top": {"policy"}, "policies": nil}[op]
	for name := range q {
		if !slices.Contains(takes, name) {
			fmt.Fprintf(stderr, "keys %s: --%s is not one of its flags (it takes --plugin or --socket%s)\n%s", op, name, flagList(takes), Usage)
			return 2
		}
	}
	if (op == "show" || op == "reset") && q.Get("key") == "" {
		fmt.Fprintf(stderr, "keys %s: --key is required (the identifier limit_by names)\n%s", op, Usage)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out any
	var err error
	if *socket != "" {
		out, err = askSocket(ctx, *socket, method, path, q)
	} else {
		out, err = direct(ctx, *plugin, *kongPrefix, method, path, q, open)
	}
	if err != nil {
		fmt.Fprintf(stderr, "keys %s: %v\n", op, err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	return 0
}

// flagList names flags for a usage message: ", --a, --b".
func flagList(names []string) string {
	var b strings.Builder
	for _, n := range names {
		b.WriteString(", --" + n)
	}
	return b.String()
}

// direct answers from the store the plugin config names, without a server.
func direct(ctx context.Context, file, kongPrefix, method, path string, q url.Values, open Open) (any, error) {
	if path != "keys" {
		return nil, fmt.Errorf("--plugin reads and resets keys in the shared store; the policies in force and the keys denied most live in the server: use --socket")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	t, err := open(kongPrefix, b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if t.Store.Redis == nil && t.Store.External == nil {
		return nil, fmt.Errorf("%s: policy local keeps its counters in the plugin server's memory: start the server with %s=PATH and use --socket PATH", file, admin.SocketEnv)
	}
	p, name, err := t.pick(q.Get("policy"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	h, err := openstore.Acquire(t.Store)
	if err != nil {
		return nil, err
	}
	defer h.Release()
	// One call, no requests: no sketch of the keys denied most.
	g, err := gate.New(gate.Config{Rules: []gate.Rule{{Limiter: core.NewLimiter(p, h.Store)}}, TopDenied: -1})
	if err != nil {
		return nil, err
	}
	return admin.Answer(ctx, g, h, gate.Scope{Name: name, Prefix: t.Scope.Prefix}, method, path, q)
}

// pick returns the policy --policy names (by its own name, or as the
// answers name it), or the first when it names none, and its name in
// answers.
func (t *Target) pick(want string) (*core.Policy, string, error) {
	if len(t.Policies) == 0 {
		return nil, "", fmt.Errorf("the config has no policy")
	}
	if len(t.Policies) == 1 {
		return t.Policies[0], t.Scope.Name, nil
	}
	var names []string
	for _, p := range t.Policies {
		shown := t.Scope.Name + ",policy=" + p.Name()
		if want == "" || want == p.Name() || want == shown {
			return p, shown, nil
		}
		names = append(names, p.Name())
	}
	return nil, "", fmt.Errorf("--policy %q: the config's policies are %q", want, names)
}

// askSocket asks the API a server serves on the Unix socket at path.
func askSocket(ctx context.Context, socket, method, path string, q url.Values) (any, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, err := http.NewRequestWithContext(ctx, method, "http://tollgate/tollgate/"+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("%s: %s answered %s and no JSON", socket, path, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		if m, ok := out.(map[string]any); ok && m["error"] != nil {
			return nil, errors.New(fmt.Sprint(m["error"]))
		}
		return nil, fmt.Errorf("%s: %s", socket, resp.Status)
	}
	return out, nil
}
