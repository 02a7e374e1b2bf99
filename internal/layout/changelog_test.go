package layout

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/internal/reporoot"
)

// TestChangelogNamesTheVersion holds CHANGELOG.md to Keep a Changelog's
// form where a user pinning a release reads it: releases newest first,
// each dated, the newest being core.Version (what the plugin servers, -dump
// and the operators' API report); only an Unreleased entry may come
// before it.
func TestChangelogNamesTheVersion(t *testing.T) {
	root, err := reporoot.Dir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	entries := regexp.MustCompile(`(?m)^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$`).FindAllSubmatch(b, -1)
	var versions, dates []string
	for i, e := range entries {
		if string(e[1]) == "Unreleased" {
			if i != 0 {
				t.Errorf("CHANGELOG.md: [Unreleased] is entry %d, want it first", i+1)
			}
			continue
		}
		versions = append(versions, string(e[1]))
		dates = append(dates, string(e[2]))
	}
	if len(versions) == 0 || versions[0] != core.Version {
		t.Fatalf("CHANGELOG.md: newest release %v, want core.Version %s", versions, core.Version)
	}
	if dates[0] == "" {
		t.Errorf("CHANGELOG.md: release %s has no date", versions[0])
	}
	for i := 1; i < len(dates); i++ {
		if dates[i] != "" && dates[i] > dates[i-1] {
			t.Errorf("CHANGELOG.md: %s (%s) is listed before the later %s (%s)", versions[i-1], dates[i-1], versions[i], dates[i])
		}
	}
}
