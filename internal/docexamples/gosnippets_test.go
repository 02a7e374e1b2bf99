package docexamples

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/reporoot"
)

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestGoSnippetsAreExamples: every Go snippet of README.md and docs/ is
// the code of an Example function (its lines, in order, in a test file
// that has one), so `make test` compiles each, and runs those that print.
func TestGoSnippetsAreExamples(t *testing.T) {
	root, err := reporoot.Dir()
	if err != nil {
		t.Fatal(err)
	}
	var examples [][]string // the trimmed lines of each test file with an Example
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			if d != nil && d.IsDir() {
				return filepath.SkipDir
			}
			return err
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), "\nfunc Example") {
			return err
		}
		examples = append(examples, trimmedLines(string(b)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	pages = append(pages, filepath.Join(root, "README.md"))
	snippets := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range goBlock.FindAllStringSubmatch(string(b), -1) {
			snippets++
			want := trimmedLines(m[1])
			if !inOrder(examples, want) {
				t.Errorf("%s: a Go snippet that is no Example's code (write it as an Example function in a _test.go file, and show its lines here):\n%s", filepath.Base(page), m[1])
			}
		}
	}
	if snippets == 0 {
		t.Fatal("no Go snippet found in README.md or docs/")
	}
}

// trimmedLines are s's non-blank lines without their indentation.
func trimmedLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// inOrder reports whether one of the files holds want's lines in order.
func inOrder(files [][]string, want []string) bool {
	for _, have := range files {
		i := 0
		for _, l := range have {
			if i < len(want) && l == want[i] {
				i++
			}
		}
		if i == len(want) {
			return true
		}
	}
	return false
}
