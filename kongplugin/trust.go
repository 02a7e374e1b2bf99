package kongplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/tollgate/tollgate/kongplugin/internal/kongenv"
)

// kongPrefix is the prefix of the Kong that started this plugin server
// (-kong-prefix), set once by Serve, or the keys command's --kong-prefix;
// "" when the plugin runs elsewhere (the keys command without it, Go
// tests), where the system's CAs verify Redis.
var kongPrefix atomic.Pointer[string]

// startingKong is kongPrefix's value: the prefix of the Kong that started
// this plugin server, "" if none did.
func startingKong() string {
	if p := kongPrefix.Load(); p != nil {
		return *p
	}
	return ""
}

// kongTrust is what Kong's own cosockets verify a TLS server with:
// lua_ssl_trusted_certificate (files and `system`, which Kong resolves
// to the system's bundle and concatenates into the file named by
// lua_ssl_trusted_certificate_combined, kong/conf_loader/init.lua and
// kong/cmd/utils/prefix_handler.lua) and lua_ssl_verify_depth (the CA
// certificates a chain may have above the server's; Kong's default 1).
type kongTrust struct {
	caFile   string // PEM: every CA Kong trusts; "" for the system's
	maxChain int    // certificates in a verified chain; 0 for no bound
}

// readKongTrust reads Kong's trust from the prefix's .kong_env. Without a
// prefix or a .kong_env (not started by Kong) it is the system's.
func readKongTrust(prefix string) (kongTrust, error) {
	if prefix == "" {
		return kongTrust{}, nil
	}
	env, err := kongenv.Read(prefix)
	if errors.Is(err, fs.ErrPermission) {
		return kongTrust{}, fmt.Errorf("ssl_verify: Kong's trusted CAs are in %s, which this plugin server (uid %d) may not read: %w", filepath.Join(prefix, kongenv.File), os.Getuid(), err)
	}
	if err != nil || env == nil {
		return kongTrust{}, err
	}
	depth, err := env.Int("lua_ssl_verify_depth", 1)
	if err != nil {
		return kongTrust{}, fmt.Errorf("ssl_verify: %w", err)
	}
	if depth < 0 {
		return kongTrust{}, fmt.Errorf("ssl_verify: lua_ssl_verify_depth = %d in %s is negative", depth, env.Path)
	}
	combined, ok := env.Get("lua_ssl_trusted_certificate_combined")
	if len(env.List("lua_ssl_trusted_certificate")) == 0 || !ok {
		return kongTrust{}, fmt.Errorf("ssl_verify: Kong trusts no CA (lua_ssl_trusted_certificate is empty in %s), so no Redis certificate can be verified; set lua_ssl_trusted_certificate (system, or CA files) in kong.conf, or ssl_verify: false", env.Path)
	}
	return kongTrust{caFile: combined, maxChain: depth + 1}, nil
}
