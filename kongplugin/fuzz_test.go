package kongplugin

import (
	"testing"

	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
)

// FuzzKongConfig feeds arbitrary JSON to the config decoder Kong's
// StartInstance runs: it must never panic, an accepted config is compiled,
// and a refused one says why.
func FuzzKongConfig(f *testing.F) {
	for _, seed := range []string{
		`{"minute":5}`,
		`{"second":1,"hour":100,"limit_by":"header","header_name":"X-Key","policy":"local"}`,
		`{"minute":5,"policy":"redis","redis":{"host":"h","port":6379,"timeout":100},"sync_rate":0.5}`,
		`{"limits":[{"count":5,"window":"10s","algorithm":"leaky_bucket","max_delay":"1s"}],"headers":"ietf"}`,
		`{"minute":null,"hour":3,"redis_host":"x","redis_port":1,"fault_tolerant":false,"error_code":503}`,
		`{"limits":[{"count":1e300,"window":"1e300s"}]}`,
		`{"minute":2.5,"hour":1e300,"redis":{"port":0,"timeout":0}}`,
		`null`, `[]`, `"x"`, `1`, `{"minute":5,"redis":null,"adaptive":null}`, `{"minute":5,"adaptive":{}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Config
		err := c.decode(b, WithResponse)
		if err == nil && c.compiled == nil {
			t.Fatalf("accepted %s without compiling it", b)
		}
		if err != nil && err.Error() == "" {
			t.Fatalf("refused %s without a reason", b)
		}
	})
}

// FuzzKeysPluginFile feeds arbitrary bytes to what the keys command reads
// from its --plugin file (a plugin entity as Kong's Admin API returns it,
// or its bare config): it never panics, and a refusal says why.
func FuzzKeysPluginFile(f *testing.F) {
	for _, seed := range []string{
		`{"id":"p","name":"tollgate","config":{"minute":5,"policy":"redis","redis":{"host":"h"}},"route":{"id":"r"},"service":null}`,
		`{"minute":5}`, `null`, `[]`, `{"config":null}`, `{"config":[]}`, `{"config":{"minute":5},"route":"r"}`, `{"config":{"minute":5},"route":{"id":7}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		config, err := kongschema.PluginConfig(b)
		if err == nil {
			_, err = AccessOnly.KeysTarget("", config)
		}
		if err != nil && err.Error() == "" {
			t.Fatalf("refused %s without a reason", b)
		}
	})
}
