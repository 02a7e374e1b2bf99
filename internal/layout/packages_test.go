package layout

import (
	"flag"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/architecture.md's package table from the code")

const (
	tableBegin = "<!-- The package table below is made from each package's comment: go test ./internal/layout -run TestArchitecturePackageTable -update -->"
	tableEnd   = "<!-- end of the package table -->"
)

// packageDocs returns every package of the module (bench, its own module,
// aside) with the first sentence of its comment, by directory; a
// package without a comment that begins "Package <name>" (or "Command
// <name>" for a main package) fails t.
func packageDocs(t *testing.T) map[string]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if rel == "bench" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && rel != "." {
			return filepath.SkipDir
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		var names []string
		var text string
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(path, e.Name()), nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			names = append(names, f.Name.Name)
			if f.Doc != nil && text == "" {
				text = f.Doc.Text()
			}
		}
		if len(names) == 0 {
			return nil
		}
		name := strings.TrimSuffix(slices.Min(names), "_test") // a test-only package's name
		want := "Package " + name + " "
		if name == "main" {
			want = "Command " + filepath.Base(path) + " "
		}
		if rel == "." {
			rel = "(root)"
		}
		if !strings.HasPrefix(text, want) {
			t.Errorf("%s: its comment must begin %q (got %.40q)", rel, want, text)
		}
		out[rel] = new(doc.Package).Synopsis(text)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// packageTable is docs/architecture.md's table of packages.
func packageTable(docs map[string]string) string {
	dirs := make([]string, 0, len(docs))
	for d := range docs {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	var b strings.Builder
	b.WriteString("| package | what it is (its comment's first sentence) |\n| --- | --- |\n")
	for _, d := range dirs {
		b.WriteString("| `" + d + "` | " + strings.ReplaceAll(docs[d], "|", `\|`) + " |\n")
	}
	return b.String()
}

// TestArchitecturePackageTable: docs/architecture.md's table of packages
// is what the packages' comments say, so a package added, moved or
// renamed shows there (and a package comment naming another package
// fails here). -update rewrites the table.
func TestArchitecturePackageTable(t *testing.T) {
	const page = "../../docs/architecture.md"
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, tableBegin), strings.Index(s, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no table between %q and %q", page, tableBegin, tableEnd)
	}
	want := packageTable(packageDocs(t))
	got := s[i+len(tableBegin)+1 : j]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(page, []byte(s[:i+len(tableBegin)+1]+want+s[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the package table is not what the packages' comments say; run go test ./internal/layout -run TestArchitecturePackageTable -update", page)
}
