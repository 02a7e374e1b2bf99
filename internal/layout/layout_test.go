// Package layout checks the arrows docs/architecture.md says must never
// exist, by reading the imports of every production (non-test) Go file.
package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/tollgate/tollgate"

// imports maps each package directory (relative to the module root) to the
// imports of its non-test files.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "bench" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir // its own module, or tooling
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			out[dir] = append(out[dir], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out["core"]) == 0 || len(out["caddymodule"]) == 0 {
		t.Fatalf("found no packages under %s", root)
	}
	return out
}

func TestArrowsThatMustNeverExist(t *testing.T) {
	stores := []string{"core/store/memory", "core/store/redis", "core/store/eventual", "core/store/failover"}
	adapters := []string{"caddymodule", "kongplugin", "core/httplimit"}
	gateways := []string{"github.com/caddyserver/", "github.com/Kong/"}
	for dir, imps := range imports(t) {
		for _, imp := range imps {
			local, isLocal := strings.CutPrefix(imp, module+"/")
			switch {
			case strings.HasPrefix(dir, "core") && hasPrefix(imp, gateways):
				t.Errorf("%s imports %s: core knows no gateway", dir, imp)
			case dir == "core" && isLocal && !strings.HasPrefix(local, "core/internal/"):
				t.Errorf("core imports %s: core knows no store or adapter", imp)
			case contains(stores, dir) && isLocal && (contains(stores, local) || local == "core/store"):
				t.Errorf("%s imports %s: stores are siblings; only core/store composes them", dir, imp)
			case contains(adapters, dir) && isLocal && contains(stores, local):
				t.Errorf("%s imports %s: adapters reach stores only through core/store", dir, imp)
			case contains(adapters, dir) && isLocal && contains(adapters, local):
				t.Errorf("%s imports %s: adapters are siblings", dir, imp)
			case isLocal && strings.HasPrefix(local, "internal/") && !strings.HasPrefix(dir, "internal/"):
				t.Errorf("%s imports %s: internal/ holds test harnesses only", dir, imp)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
