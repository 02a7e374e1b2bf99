// Command tollgate is the Kong plugin server Kong starts (and names the
// plugin after): tollgate in Kong's access phase only, the drop-in for
// Kong's rate-limiting. `tollgate -dump` prints its info and schema for
// Kong. Configs with in-flight or adaptive limits need tollgate-response.
package main

import (
	"log"

	"github.com/tollgate/tollgate/kongplugin"
)

func main() {
	if err := kongplugin.Serve(kongplugin.AccessOnly); err != nil {
		log.Fatal(err)
	}
}
