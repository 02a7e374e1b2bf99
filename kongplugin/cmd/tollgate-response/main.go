// Command tollgate-response is the plugin server of tollgate-response:
// tollgate with Kong's log phase too, for configs whose limits need the
// finished response (in-flight and adaptive limits). Kong runs the log
// phase for every request of every route using this plugin; configs that
// need neither use tollgate, which costs Kong one event per request.
package main

import (
	"os"

	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/kongplugin"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// main reads the operators' socket path from $TOLLGATE_ADMIN_SOCKET
// (admin.SocketEnv) and $GOMAXPROCS (pluginserver.RunBesideKong): the
// environment variables the server reads; its
// command line is kongplugin.Main's.
func main() {
	pluginserver.RunBesideKong(os.Getenv("GOMAXPROCS"))
	os.Exit(kongplugin.Main(os.Args, kongplugin.WithResponse, os.Getenv(admin.SocketEnv)))
}
