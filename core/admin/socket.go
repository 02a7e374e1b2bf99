package admin

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// SocketEnv names the environment variable a gateway's plugin server
// command reads for the path of the API's Unix socket (see ServeSocket);
// the command reads it, this package reads no environment.
const SocketEnv = "TOLLGATE_ADMIN_SOCKET"

// ServeSocket serves Handler("/tollgate/") on a Unix socket at path ("":
// none) with mode 0600: only the user the server runs as (and root) can
// read or reset keys. It is how operators reach counters that live in a
// process with no admin endpoint of its own (its memory store's counters,
// and every policy's heaviest offenders).
func ServeSocket(path string) error {
	if path == "" {
		return nil
	}
	_ = os.Remove(path) // a socket left by an earlier run of the server
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", SocketEnv, path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("%s=%s: %w", SocketEnv, path, err)
	}
	srv := &http.Server{Handler: Handler("/tollgate/"), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return nil
}

// Answer serves one call of the API (a method and path as Handler serves
// them, q its parameters) on rule 0 of a gate that is not registered: a
// tool that opens a policy's store itself (a gateway's keys command)
// answers as the API would. scope's Name names the policy in answers; the
// keys q gives are read in scope.
func Answer(ctx context.Context, g *gate.Gate, h *openstore.Handle, scope gate.Scope, method, path string, q url.Values) (any, error) {
	out, _, err := (&entry{gate: g, store: h, scope: scope}).answer(ctx, 0, method, path, q)
	return out, err
}
