package kongplugin_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/kongproc"
)

// TestKongCommandLine: each plugin server refuses words it does not know
// with its usage and exit status 2, before it opens anything (a typo such
// as `tollgate dump` once started a second server on Kong's socket), and
// -h lists every subcommand.
func TestKongCommandLine(t *testing.T) {
	for _, pkg := range []string{kongproc.PluginPackage, kongproc.ResponsePackage, kongproc.ResponseLimitsPackage} {
		bin := kongproc.BinaryOf(t, pkg)
		name := filepath.Base(bin)
		run := func(args ...string) (int, string) {
			prefix := t.TempDir()
			cmd := exec.Command(bin, append([]string{"-kong-prefix", prefix}, args...)...)
			if len(args) > 0 && args[0] == "-h" {
				cmd = exec.Command(bin, args...)
			}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(prefix, name+".socket")); err == nil {
				t.Errorf("%s %v opened the plugin socket", name, args)
			}
			return code, out.String()
		}
		for _, args := range [][]string{{"dump"}, {"key", "show"}, {"-no-such-flag"}, {"-dump", "extra"}} {
			code, out := run(args...)
			if code != 2 || !strings.Contains(out, "usage:") {
				t.Errorf("%s %v: exit %d, want 2 with the usage:\n%s", name, args, code, out)
			}
			if args[0] == "dump" && !strings.Contains(out, `unknown subcommand or argument "dump"`) {
				t.Errorf("%s dump: the message does not name the word:\n%s", name, out)
			}
		}
		code, out := run("-h")
		for _, want := range []string{" version ", " keys ", "-dump", "-kong-prefix"} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("%s -h: exit %d, want 0 and usage naming %q:\n%s", name, code, want, out)
			}
		}
	}
}
