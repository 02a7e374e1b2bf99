// Command tollgate-response-ratelimiting is the plugin server of
// tollgate-response-ratelimiting, the drop-in for Kong's bundled
// response-ratelimiting plugin: the upstream reports what each call cost
// in a response header (X-Kong-Limit: videos=2, images=4), and each
// resource is limited per period. Kong runs its access and response
// phases (the response phase buffers the upstream's response).
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
// command line is kongplugin.MainResponseLimits'.
func main() {
	pluginserver.RunBesideKong(os.Getenv("GOMAXPROCS"))
	os.Exit(kongplugin.MainResponseLimits(os.Args, os.Getenv(admin.SocketEnv)))
}
