// Command kongfloor is the floor tollgate's Kong plugin is measured
// against (kongplugin's BenchmarkVsFloor, and in real Kong make
// bench-kong): tollgate's own plugin server (pluginserver, with the same
// command line, command.Main), making the PDK calls tollgate makes for an
// allowed request keyed on the client IP (kong.client.get_forwarded_ip,
// then one kong.response.set_headers with Kong's five rate-limit headers
// of the same sizes), and deciding nothing, so what tollgate costs above
// it is deciding alone; with `no_calls: true` it makes none, so an
// event's own cost shows.
package main

import (
	"encoding/json"
	"errors"
	"os"

	"github.com/Kong/go-pdk"

	"github.com/tollgate/tollgate/kongplugin/internal/command"
	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// Config is the floor's config: NoCalls makes the event call nothing.
type Config struct {
	NoCalls bool `json:"no_calls"`
}

// Access makes tollgate's PDK calls for an allowed request.
func (c *Config) Access(kong *pdk.PDK) {
	if c.NoCalls {
		return
	}
	if _, err := kong.Client.GetForwardedIp(); err != nil {
		return
	}
	headers := make(pluginserver.Headers, 8)
	headers.Set("X-RateLimit-Limit-Second", "1000000000")
	headers.Set("X-RateLimit-Remaining-Second", "999999999")
	headers.Set("RateLimit-Limit", "1000000000")
	headers.Set("RateLimit-Remaining", "999999999")
	headers.Set("RateLimit-Reset", "1")
	_ = pluginserver.SetHeaders(kong, headers)
}

var schema = kongschema.MustParse([]byte(`{"fields": [{"config": {"type": "record", "fields": [
	{"no_calls": {"type": "boolean", "default": false}}]}}]}`))

func start(config []byte) (any, error) {
	c := &Config{}
	return c, json.Unmarshal(config, c)
}

// main runs Go on the CPUs tollgate's plugin servers take
// (pluginserver.RunBesideKong), so the two are measured alike.
func main() {
	pluginserver.RunBesideKong(os.Getenv("GOMAXPROCS"))
	os.Exit(command.Main(os.Args, command.Program{
		Schema: func() *kongschema.Schema { return schema },
		Info:   kongschema.Info{Version: "0.1.0", Priority: 910, Phases: []string{"access"}},
		Serve: func(_, name, socket string) error {
			return pluginserver.ListenAndServe(name, socket, start)
		},
		Keys: func(string, []byte) (keys.Target, error) { return keys.Target{}, errors.New("the floor keeps no keys") },
	}, os.Stdout, os.Stderr))
}
