// Command tollgate-response is the plugin server of tollgate-response:
// tollgate with Kong's log phase too, for configs whose limits need the
// finished response (in-flight and adaptive limits). Kong runs the log
// phase for every request of every route using this plugin; configs that
// need neither use tollgate, which costs Kong one event per request.
package main

import (
	"log"

	"github.com/tollgate/tollgate/kongplugin"
)

func main() {
	if err := kongplugin.Serve(kongplugin.WithResponse); err != nil {
		log.Fatal(err)
	}
}
