// Command tollgate is the Kong plugin server Kong starts (and names the
// plugin after); `tollgate -dump` prints its info and schema for Kong.
package main

import (
	"log"

	"github.com/Kong/go-pdk/server"
	"github.com/tollgate/tollgate/kongplugin"
)

func main() {
	if err := server.StartServer(kongplugin.New, kongplugin.Version, kongplugin.Priority); err != nil {
		log.Fatal(err)
	}
}
