package layout

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// environmentReads lists each production file of core, caddymodule and
// kongplugin (not tests or a test-support package such as storetest, not
// a command's main package, not a file built only under a test build tag)
// that calls os.Getenv, os.LookupEnv or
// os.Environ: a gateway's behaviour comes from its config, and what a
// plugin server reads from its environment is read by its main.
func environmentReads(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	for _, top := range []string{"core", "caddymodule", "kongplugin"} {
		if _, err := os.Stat(filepath.Join(root, top)); err != nil {
			continue
		}
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			if f.Name.Name == "main" || strings.HasSuffix(f.Name.Name, "test") || testOnly(f) {
				return nil
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "os" && (sel.Sel.Name == "Getenv" || sel.Sel.Name == "LookupEnv" || sel.Sel.Name == "Environ") {
						rel, _ := filepath.Rel(root, path)
						found = append(found, filepath.ToSlash(rel)+": os."+sel.Sel.Name)
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return found
}

// testOnly reports whether f builds only under a tag whose name says it
// is for tests (tollgate_testclock): no production build has it.
func testOnly(f *ast.File) bool {
	for _, g := range f.Comments {
		for _, c := range g.List {
			if expr, err := constraint.Parse(c.Text); err == nil {
				if !expr.Eval(func(tag string) bool { return !strings.Contains(tag, "test") }) {
					return true
				}
			}
		}
	}
	return false
}

// TestProductionReadsNoEnvironment: no production package reads the
// environment; only the commands' main packages do.
func TestProductionReadsNoEnvironment(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if found := environmentReads(t, root); len(found) > 0 {
		t.Errorf("production code reads the environment (read it in the command's main and pass it in):\n%s", strings.Join(found, "\n"))
	}
}

// TestProductionReadsNoEnvironmentCatches: the check finds a planted read.
func TestProductionReadsNoEnvironmentCatches(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "core", "x", "x.go"), "package x\n\nimport \"os\"\n\nvar v = os.Getenv(\"X\")\n")
	writeFile(t, filepath.Join(root, "core", "x", "clock.go"), "//go:build tollgate_testclock\n\npackage x\n\nimport \"os\"\n\nvar w = os.Getenv(\"Y\")\n")
	writeFile(t, filepath.Join(root, "kongplugin", "cmd", "c", "main.go"), "package main\n\nimport \"os\"\n\nfunc main() { _ = os.Getenv(\"Z\") }\n")
	found := environmentReads(t, root)
	if len(found) != 1 || found[0] != "core/x/x.go: os.Getenv" {
		t.Errorf("found %v, want only core/x/x.go's read", found)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
