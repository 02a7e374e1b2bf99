package caddymodule

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/core/config"
)

// TestPlansWordLines: a plans block's lines (words, as a config file
// writes them) stack limits per plan.
func TestPlansWordLines(t *testing.T) {
	s := config.Policy{Name: "api"}
	for _, line := range [][]string{{"free", "100/1h"}, {"free", "10/1m"}, {"pro", "10000/1h"}, {"pro", "1000/1m"}, {"internal", "unlimited"}} {
		if err := setPlan(&s, line[0], line[1:]); err != nil {
			t.Fatal(err)
		}
	}
	if err := setPlan(&s, "pro", []string{"lots"}); err == nil || !strings.Contains(err.Error(), `policy "api" plan "pro" limit "lots"`) {
		t.Errorf("bad limit: %v", err)
	}
	if len(s.Plans) != 3 || len(s.Plans[0].Limits) != 2 || len(s.Plans[1].Limits) != 2 || !s.Plans[2].Unlimited {
		t.Fatalf("plans %+v", s.Plans)
	}
	s.DefaultPlan = "free"
	if _, err := s.Check(); err != nil {
		t.Fatal(err)
	}
}
