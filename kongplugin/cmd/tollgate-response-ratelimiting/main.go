// Command tollgate-response-ratelimiting is the plugin server of
// tollgate-response-ratelimiting, the drop-in for Kong's bundled
// response-ratelimiting plugin: the upstream reports what each call cost
// in a response header (X-Kong-Limit: videos=2, images=4), and each
// resource is limited per period. Kong runs its access and response
// phases (the response phase buffers the upstream's response).
package main

import (
	"log"

	"github.com/tollgate/tollgate/kongplugin"
)

func main() {
	if err := kongplugin.ServeResponseLimits(); err != nil {
		log.Fatal(err)
	}
}
