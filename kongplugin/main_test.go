package kongplugin_test

import (
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/kongproc"
)

// TestMain removes the plugin servers the tests build.
func TestMain(m *testing.M) { os.Exit(kongproc.Main(m)) }
