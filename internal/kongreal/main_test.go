//go:build kongreal

package kongreal

import (
	"os"
	"testing"
)

// TestMain removes the plugin servers the tests build.
func TestMain(m *testing.M) {
	code := m.Run()
	RemovePluginDir()
	os.Exit(code)
}
