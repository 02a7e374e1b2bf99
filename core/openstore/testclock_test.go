//go:build !tollgate_testclock

package openstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/gate"
)

// TestClockEnvIgnoredInProductionBuilds: a binary built without the
// tollgate_testclock tag (this test's, and every production build) keeps
// its stores' own clocks, whatever TestClockFileEnv says: the environment
// cannot move a gateway's clock.
func TestClockEnvIgnoredInProductionBuilds(t *testing.T) {
	file := filepath.Join(t.TempDir(), "now")
	if err := os.WriteFile(file, []byte("1000000"), 0o644); err != nil { // 1 s after the epoch
		t.Fatal(err)
	}
	t.Setenv(TestClockFileEnv, file)
	h, err := Acquire(Config{MaxKeys: 12345})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	p := core.MustPolicy("clock", core.PolicyOptions{}, algo.Limit{Count: 1, Window: 24 * time.Hour, Algorithm: algo.FixedWindow})
	rule := h.Rule(p, gate.EmptyKeySkip, "")
	var d core.Decision
	if err := rule.Limiter.Decide(context.Background(), "k", 1, &d); err != nil {
		t.Fatal(err)
	}
	// A fixed window of a day that began at the epoch resets within a day of
	// 1970; on the machine's own clock it resets before the next midnight UTC.
	if wantBefore := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); d.Reset > wantBefore+time.Second {
		t.Fatalf("reset in %s: the decision took the file's time (1970), not the machine's (next midnight in %s)", d.Reset, wantBefore)
	}
}
