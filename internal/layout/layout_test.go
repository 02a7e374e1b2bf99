// Package layout checks the arrows docs/architecture.md says must never
// exist, by reading the imports of every production (non-test) Go file.
package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
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
	concepts := conceptPackages()
	adapters := []string{"caddymodule", "kongplugin", "core/httplimit"}
	gateways := []string{"github.com/caddyserver/", "github.com/Kong/"}
	for dir, imps := range imports(t) {
		for _, imp := range imps {
			local, isLocal := strings.CutPrefix(imp, module+"/")
			switch {
			case strings.HasPrefix(dir, "core") && hasPrefix(imp, gateways):
				t.Errorf("%s imports %s: core knows no gateway", dir, imp)
			case dir == "core/config" && (contains(stores, local) || local == "core/openstore"):
				// The one maker of a gate config sits above the stores,
				// beside opening them: it checks a config against its
				// store's rules (memory's bounds, Redis's addresses,
				// eventual's algorithms) once, and opens it.
			case dir == "core/openstore" && local == "core/config":
				t.Errorf("%s imports %s: the config package opens stores through core/openstore, not the reverse", dir, imp)
			case concepts[dir] != nil && isLocal && concepts[local] == nil && !strings.HasPrefix(local, "core/internal/"):
				t.Errorf("%s imports %s: core's concepts know no store or adapter", dir, imp)
			case concepts[dir] != nil && concepts[local] != nil && !contains(concepts[dir], local):
				t.Errorf("%s imports %s: core's concepts are layered (%s may import only %v)", dir, imp, dir, concepts[dir])
			case dir == "core/store/failover" && local == "core/store/memory":
				// The failure policy's default fallback (on_error local,
				// Options.Local nil) is a memory store of its own.
			case contains(stores, dir) && isLocal && (contains(stores, local) || local == "core/openstore"):
				t.Errorf("%s imports %s: stores are siblings; only core/openstore composes them", dir, imp)
			case contains(stores, dir) && isLocal && local == "core/gate":
				t.Errorf("%s imports %s: stores sit below the gate; core/openstore makes them gate rules", dir, imp)
			case contains(adapters, dir) && isLocal && contains(stores, local):
				t.Errorf("%s imports %s: adapters reach stores only through core/openstore", dir, imp)
			case contains(adapters, dir) && isLocal && contains(adapters, local):
				t.Errorf("%s imports %s: adapters are siblings", dir, imp)
			case isLocal && strings.HasPrefix(local, "internal/") && !strings.HasPrefix(dir, "internal/"):
				t.Errorf("%s imports %s: internal/ holds test harnesses only", dir, imp)
			}
		}
	}
}

// conceptPackages maps each of core's concept packages to those it may
// import, lowest layer first: algorithms know nothing else; adaptive
// control scales limits; policies, decisions and the store contract use
// both; headers render decisions; usage reads what a model's answer
// spent; the request pipeline uses them all,
// and knows no store and no config syntax (core/config, above the
// stores, compiles configs into its plans). An arrow upward would be an import cycle waiting
// to happen, or a concept in the wrong room.
func conceptPackages() map[string][]string {
	return map[string][]string{
		"core/algo":     {},
		"core/adaptive": {"core/algo"},
		"core":          {"core/algo", "core/adaptive"},
		"core/headers":  {"core", "core/algo"},
		"core/usage":    {"core/algo"},
		"core/gate":     {"core", "core/algo", "core/adaptive", "core/headers", "core/usage"},
	}
}

// TestPipelineLinksNoStore: the request pipeline and the net/http
// middleware over it link no store and no Redis client, however deep the
// import: a net/http user on the memory store does not link go-redis
// (what go list -deps ./core/gate ./core/httplimit shows, read from the
// sources).
func TestPipelineLinksNoStore(t *testing.T) {
	imps := imports(t)
	for _, top := range []string{"core/gate", "core/httplimit"} {
		for _, dep := range localDeps(imps, top) {
			for _, imp := range imps[dep] {
				local, _ := strings.CutPrefix(imp, module+"/")
				if strings.HasPrefix(imp, "github.com/redis/") || strings.HasPrefix(local, "core/store/") ||
					local == "core/openstore" || local == "core/config" {
					t.Errorf("%s links %s (through %s): the pipeline knows no store and no config package", top, imp, dep)
				}
			}
		}
	}
}

// localDeps returns dir and every package of this module it imports,
// directly or not.
func localDeps(imps map[string][]string, dir string) []string {
	seen := map[string]bool{dir: true}
	order := []string{dir}
	for i := 0; i < len(order); i++ {
		for _, imp := range imps[order[i]] {
			if local, ok := strings.CutPrefix(imp, module+"/"); ok && !seen[local] {
				seen[local] = true
				order = append(order, local)
			}
		}
	}
	return order
}

// TestCorePackagesStaySmall: each package under core/ stays under about
// 1,500 lines of production code, so a newcomer can read one concept at a
// sitting; a package that outgrows it is two concepts.
func TestCorePackagesStaySmall(t *testing.T) {
	const most = 1500
	lines := map[string]int{}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(filepath.Join(root, "core"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		lines[filepath.ToSlash(rel)] += strings.Count(string(b), "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range conceptPackages() {
		if lines[dir] == 0 {
			t.Errorf("%s: no production code found", dir)
		}
	}
	for dir, n := range lines {
		if n > most {
			t.Errorf("%s: %d lines of production code, over %d: split it by concept", dir, n, most)
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
