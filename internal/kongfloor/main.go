// Command kongfloor is the floor tollgate's Kong plugin is measured
// against (kongplugin's BenchmarkVsFloor, and in real Kong make
// bench-kong): go-pdk's own plugin server, as any Go plugin has it
// (tollgate serves Kong with kongplugin/internal/pluginserver), making the
// PDK calls tollgate makes for an allowed request keyed on the client IP
// (kong.client.get_forwarded_ip, then one kong.response.set_headers with
// Kong's five rate-limit headers of the same sizes), and deciding nothing;
// with `no_calls: true` it makes none, so an event's own cost shows.
package main

import (
	"log"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/server"
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
	_ = kong.Response.SetHeaders(map[string][]string{
		"X-RateLimit-Limit-Second":     {"1000000000"},
		"X-RateLimit-Remaining-Second": {"999999999"},
		"RateLimit-Limit":              {"1000000000"},
		"RateLimit-Remaining":          {"999999999"},
		"RateLimit-Reset":              {"1"},
	})
}

func main() {
	if err := server.StartServer(func() any { return &Config{} }, "0.1.0", 910); err != nil {
		log.Fatal(err)
	}
}
