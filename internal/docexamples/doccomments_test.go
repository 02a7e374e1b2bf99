package docexamples

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/reporoot"
)

// goPackage is what a comment may name in one of the module's packages:
// its top-level names, and each type's methods and fields.
type goPackage struct {
	name     string
	symbols  map[string]bool // "Name" and "Type.Member"
	embedded map[string]bool // types with an embedded field: their promoted members are not listed
}

// qualified matches pkg.Name and pkg.Type.Member in a comment.
var qualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// docLink matches a Go doc link to the comment's own package: [Name] or
// [Type.Member].
var docLink = regexp.MustCompile(`\[([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?\]`)

// TestCommentsNameSymbolsThatExist: every comment in the module that names
// one of the module's packages' symbols (spec.EmptyKeySkip, [goPackage],
// [Decision]) names one that exists, so go doc never points a reader at
// something gone. Test files are read too, for what their comments name.
func TestCommentsNameSymbolsThatExist(t *testing.T) {
	root, err := reporoot.Dir()
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/tollgate/tollgate"
	pkgs := map[string]*goPackage{} // import path -> package
	files := map[string][]*ast.File{}
	fset := token.NewFileSet()
	err = parseGoFiles(root, fset, func(path string, f *ast.File) {
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		imp := module
		if rel != "." {
			imp += "/" + filepath.ToSlash(rel)
		}
		files[imp] = append(files[imp], f)
		p := pkgs[imp]
		if p == nil {
			p = &goPackage{symbols: map[string]bool{}, embedded: map[string]bool{}}
			pkgs[imp] = p
		}
		if !strings.HasSuffix(path, "_test.go") {
			p.name = f.Name.Name
		}
		p.add(f) // a test's names too: a comment may name a test
	})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string][]string{} // package name -> import paths
	for imp, p := range pkgs {
		if p.name == "" {
			delete(pkgs, imp) // tests only
			continue
		}
		byName[p.name] = append(byName[p.name], imp)
	}
	var wrong []string
	for imp, fs := range files {
		for _, f := range fs {
			local := map[string]string{} // the file's names for the module's packages
			shadowed := map[string]bool{}
			for _, is := range f.Imports {
				path, _ := strconv.Unquote(is.Path.Value)
				name := filepath.Base(path)
				if is.Name != nil {
					name = is.Name.Name
				}
				if _, ok := pkgs[path]; ok {
					local[name] = path
				} else {
					shadowed[name] = true // another module's package of that name (go-redis' redis)
				}
			}
			resolve := func(name string) *goPackage {
				if path, ok := local[name]; ok {
					return pkgs[path]
				}
				if shadowed[name] || len(byName[name]) != 1 {
					return nil
				}
				return pkgs[byName[name][0]]
			}
			for _, cg := range f.Comments {
				text := cg.Text()
				where := fset.Position(cg.Pos())
				for _, m := range qualified.FindAllStringSubmatch(text, -1) {
					p := resolve(m[1])
					if p == nil {
						continue
					}
					if msg := p.check(m[2], m[3]); msg != "" {
						wrong = append(wrong, where.String()+": "+m[0]+": "+msg)
					}
				}
				self := pkgs[imp]
				if self == nil {
					continue
				}
				for _, m := range docLink.FindAllStringSubmatch(text, -1) {
					if msg := self.check(m[1], m[2]); msg != "" {
						wrong = append(wrong, where.String()+": "+m[0]+": "+msg)
					}
				}
			}
		}
	}
	sort.Strings(wrong)
	for _, w := range wrong {
		rel := strings.TrimPrefix(w, root+string(filepath.Separator))
		t.Errorf("%s", rel)
	}
}

// add records f's top-level names, methods and fields.
func (p *goPackage) add(f *ast.File) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.symbols[d.Name.Name] = true
				continue
			}
			recv := d.Recv.List[0].Type
			if s, ok := recv.(*ast.StarExpr); ok {
				recv = s.X
			}
			if g, ok := recv.(*ast.IndexExpr); ok {
				recv = g.X
			}
			if g, ok := recv.(*ast.IndexListExpr); ok {
				recv = g.X
			}
			if id, ok := recv.(*ast.Ident); ok {
				p.symbols[id.Name+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.symbols[n.Name] = true
					}
				case *ast.TypeSpec:
					p.symbols[s.Name.Name] = true
					p.addMembers(s.Name.Name, s.Type)
				}
			}
		}
	}
}

// addMembers records the fields of a struct type and the methods of an
// interface type named typ.
func (p *goPackage) addMembers(typ string, expr ast.Expr) {
	var fields *ast.FieldList
	switch t := expr.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		p.embedded[typ] = true // a defined type of another: its members are elsewhere
		return
	}
	for _, fl := range fields.List {
		if len(fl.Names) == 0 {
			p.embedded[typ] = true
		}
		for _, n := range fl.Names {
			p.symbols[typ+"."+n.Name] = true
		}
	}
}

// check says what is wrong with a comment's name (and member) in p, or "".
func (p *goPackage) check(name, member string) string {
	if !p.symbols[name] {
		return "package " + p.name + " has no " + name
	}
	if member != "" && !p.symbols[name+"."+member] && !p.embedded[name] && p.hasMembers(name) {
		return "type " + p.name + "." + name + " has no field or method " + member
	}
	return ""
}

// hasMembers says whether name is a type whose fields or methods are listed
// (a function's or variable's name followed by a dot is prose, not a member).
func (p *goPackage) hasMembers(name string) bool {
	for s := range p.symbols {
		if strings.HasPrefix(s, name+".") {
			return true
		}
	}
	return false
}

// TestDocCommentsBeginWithTheirName: an exported function's, method's or
// type's doc comment begins with its name (a type's may open with "A",
// "An" or "The" first), as go doc and pkg.go.dev expect, so a comment left
// behind by a rename ("NewStore wraps…" above New) fails here.
func TestDocCommentsBeginWithTheirName(t *testing.T) {
	root, err := reporoot.Dir()
	if err != nil {
		t.Fatal(err)
	}
	var wrong []string
	fset := token.NewFileSet()
	err = parseGoFiles(root, fset, func(path string, f *ast.File) {
		if strings.HasSuffix(path, "_test.go") {
			return
		}
		check := func(name string, doc *ast.CommentGroup, articles bool) {
			if !ast.IsExported(name) || doc == nil {
				return
			}
			words := strings.Fields(doc.Text())
			if len(words) == 0 || strings.HasPrefix(words[0], "Deprecated:") {
				return
			}
			first := words[0]
			if articles && len(words) > 1 && (first == "A" || first == "An" || first == "The") {
				first = words[1]
			}
			if strings.TrimSuffix(strings.TrimRight(first, ".,:;"), "'s") != name {
				rel, _ := filepath.Rel(root, fset.Position(doc.Pos()).String())
				wrong = append(wrong, rel+": "+name+"'s comment begins with "+strconv.Quote(words[0]))
			}
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				check(d.Name.Name, d.Doc, false)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						doc := ts.Doc
						if doc == nil && len(d.Specs) == 1 {
							doc = d.Doc
						}
						check(ts.Name.Name, doc, true)
					}
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wrong {
		t.Error(w)
	}
}

// parseGoFiles parses every Go file of the tree under root (but testdata,
// built binaries and planted bugs' copies) with its comments, and hands
// each to fn with its path.
func parseGoFiles(root string, fset *token.FileSet, fn func(path string, f *ast.File)) error {
	return filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || n == "testdata" || n == "bin" || n == "node_modules" || n == ".tmp" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		fn(path, f)
		return nil
	})
}
