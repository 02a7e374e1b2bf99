// Command tollgate is the Kong plugin server Kong starts (and names the
// plugin after); `tollgate -dump` prints its info and schema for Kong.
package main

import (
	"log"

	"github.com/tollgate/tollgate/kongplugin"
)

func main() {
	if err := kongplugin.Serve(); err != nil {
		log.Fatal(err)
	}
}
