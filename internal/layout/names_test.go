package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// gatewayName is what core must not say: it knows no gateway.
var gatewayName = regexp.MustCompile(`(?i)kong|caddy|nginx`)

// coreGatewayNames lists every identifier and string literal of the Go
// files under root (tests included) and every line of its Lua files
// outside comments that names a gateway, as "file:line: text".
func coreGatewayNames(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(filepath.Dir(root), path)
		switch {
		case strings.HasSuffix(path, ".go"):
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				var text string
				switch n := n.(type) {
				case *ast.Ident:
					text = n.Name
				case *ast.BasicLit:
					if n.Kind == token.STRING {
						text = n.Value
					}
				}
				if text != "" && gatewayName.MatchString(text) {
					found = append(found, rel+":"+strconv.Itoa(fset.Position(n.Pos()).Line)+": "+text)
				}
				return true
			})
		case strings.HasSuffix(path, ".lua"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				code, _, _ := strings.Cut(line, "--")
				if gatewayName.MatchString(code) {
					found = append(found, rel+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(code))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestCoreKnowsNoGateway: no identifier or string under core/ names Kong,
// Caddy (or its Caddyfile) or nginx. What one gateway needs lives in its
// adapter's folder; what both need lives in core in a neutral form.
func TestCoreKnowsNoGateway(t *testing.T) {
	root, err := filepath.Abs("../../core")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range coreGatewayNames(t, root) {
		t.Errorf("core names a gateway: %s", f)
	}
}

// TestCoreKnowsNoGatewayCatches: the check finds a gateway's name planted
// in an identifier, in a string and in Lua code, and not in comments.
func TestCoreKnowsNoGatewayCatches(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "core")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"a.go":  "package core\n\n// Kong and Caddy in a comment are fine.\nfunc KongDenial() string { return \"x\" }\n",
		"b.go":  "package core\n\nvar style = \"caddyfile\"\n",
		"c.lua": "-- nginx in a comment is fine\nlocal x = 'nginx'\n",
		"d.go":  "package core\n\n// Nothing here.\nvar neutral = \"per_limit\"\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(coreGatewayNames(t, dir), "\n")
	for _, want := range []string{"core/a.go:4: KongDenial", `core/b.go:3: "caddyfile"`, "core/c.lua:2: local x = 'nginx'"} {
		if !strings.Contains(got, want) {
			t.Errorf("planted %q not found; found:\n%s", want, got)
		}
	}
	if strings.Contains(got, "comment") || strings.Contains(got, "d.go") {
		t.Errorf("found what is not a gateway's name in code:\n%s", got)
	}
}
