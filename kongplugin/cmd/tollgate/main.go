// Command tollgate is the Kong plugin server Kong starts (and names the
// plugin after): tollgate in Kong's access phase only, the drop-in for
// Kong's rate-limiting. `tollgate -dump` prints its info and schema for
// Kong. Configs with in-flight or adaptive limits need tollgate-response.
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
	os.Exit(kongplugin.Main(os.Args, kongplugin.AccessOnly, os.Getenv(admin.SocketEnv)))
}
