package kongplugin

import (
	"context"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core/openstore"
	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongcheck"
)

// checker is `check`'s look beyond the prefix's files (command.Program's
// Check): Kong's database, and given a plugin's config, the Redis it runs
// on, reached as an instance reaches it. target compiles a config as the
// keys command does.
func checker(target func(prefix string, config []byte) (keys.Target, error)) func(prefix string, plugin []byte) []kongcheck.Line {
	return func(prefix string, plugin []byte) []kongcheck.Line {
		lines := checkKongDatabase(prefix)
		if plugin != nil {
			lines = append(lines, checkPluginStore(prefix, plugin, target))
		}
		return lines
	}
}

// checkPluginStore reaches the Redis a plugin's config runs on, with the
// config's settings and Kong's trust.
func checkPluginStore(prefix string, config []byte, target func(string, []byte) (keys.Target, error)) kongcheck.Line {
	t, err := target(prefix, config)
	if err != nil {
		return kongcheck.Line{Text: "the plugin's config: " + err.Error(), Fix: "the Admin API took it? then this is what its instances answer 500 for"}
	}
	if t.Store.Redis == nil {
		return kongcheck.Line{OK: true, Text: "the plugin's config keeps its counters on this node or in Kong's database: no Redis to reach"}
	}
	h, err := openstore.Acquire(t.Store)
	if err != nil {
		return kongcheck.Line{Text: "the plugin's Redis: " + err.Error()}
	}
	defer h.Release()
	addrs := strings.Join(t.Store.Redis.Addrs, ",")
	if addrs == "" {
		addrs = "its URL"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Redis.Ping(ctx); err != nil {
		return kongcheck.Line{Text: "the plugin's Redis at " + addrs + ": " + err.Error(),
			Fix: "the plugin server reaches Redis with the config's redis settings and, for ssl_verify, the CAs Kong trusts (lua_ssl_trusted_certificate): is Redis up there, and are they right?"}
	}
	return kongcheck.Line{OK: true, Text: "the plugin's Redis at " + addrs + " answers"}
}
