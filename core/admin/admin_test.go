package admin

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// registerTestGate registers a gate of one policy named name on a fresh
// memory store under generation.
func registerTestGate(t testing.TB, name string, count int64, generation any) (func(), error) {
	h, err := openstore.Acquire(openstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Release() })
	p := core.MustPolicy(name, core.PolicyOptions{}, algo.Limit{Count: count, Window: time.Minute})
	rule := h.Rule(p, gate.EmptyKeySkip, "")
	g, err := gate.New(gate.Config{Rules: []gate.Rule{rule}})
	if err != nil {
		t.Fatal(err)
	}
	return Register(g, h, generation)
}

// TestRegisterOneNameOnePolicy: within one generation, a policy name names
// one policy; a reload (a new generation) may change it.
func TestRegisterOneNameOnePolicy(t *testing.T) {
	gen, next := new(int), new(int)
	off, err := registerTestGate(t, "api", 3, gen)
	if err != nil {
		t.Fatal(err)
	}
	defer off()
	if _, err := registerTestGate(t, "api", 100, gen); err == nil || !strings.Contains(err.Error(), `policy "api": the name is given to two different policies`) {
		t.Fatalf("a second policy named api in one config: %v", err)
	}
	off2, err := registerTestGate(t, "api", 100, next)
	if err != nil {
		t.Fatalf("the next config's api: %v", err)
	}
	off2()
}

// FuzzAdminAPI sends arbitrary methods, paths, queries and bodies to the
// operators' API: it never panics, and always answers JSON.
func FuzzAdminAPI(f *testing.F) {
	for _, seed := range [][4]string{
		{"GET", "policies", "", ""}, {"GET", "keys", "policy=fuzz&key=k", ""}, {"DELETE", "keys", "policy=fuzz&key=k&limit=3/1m", ""},
		{"GET", "top", "policy=fuzz", ""}, {"POST", "keys/show", "", `{"policy":"fuzz","key":"k"}`},
		{"POST", "keys/reset", "", `{"policy":"fuzz","key":"k","limit":"nope"}`}, {"POST", "keys/show", "", `null`},
		{"GET", "keys", "policy=fuzz&key=k&plan=%zz", ""}, {"PUT", "keys", "policy=fuzz", "x"}, {"POST", "keys/show", "", `{"key":1}`},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	off, err := registerTestGate(f, "fuzz", 3, new(int))
	if err != nil {
		f.Fatal(err)
	}
	defer off()
	api := Handler("/tollgate/")
	f.Fuzz(func(t *testing.T, method, path, query, body string) {
		r, err := http.NewRequest(method, "http://admin/tollgate/"+path, strings.NewReader(body))
		if err != nil {
			return
		}
		r.URL.RawQuery = query
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %s?%s: %d %q is not JSON", method, path, query, w.Code, w.Body.String())
		}
	})
}

// TestRegisterRuleOfSeveralPolicies: a named entry whose gate has several
// rules (one per policy) names each "<name>,policy=<policy>", so every
// rule's keys can be read and reset, not only the first one's.
func TestRegisterRuleOfSeveralPolicies(t *testing.T) {
	h, err := openstore.Acquire(openstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Release() })
	var rules []gate.Rule
	for _, name := range []string{"image", "video"} {
		rule := h.Rule(core.MustPolicy(name, core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute}), gate.EmptyKeySkip, "")
		rules = append(rules, rule)
	}
	g, err := gate.New(gate.Config{Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	RegisterRule(gate.Scope{Name: "route=r1,service=", Prefix: "scope|"}, g, h)
	var d core.Decision
	for range 3 {
		if err := rules[1].Limiter.Decide(t.Context(), "scope|alice", 1, &d); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(Handler("/tollgate/"))
	defer srv.Close()
	res, err := http.Get(srv.URL + "/tollgate/keys?policy=route%3Dr1%2Cservice%3D%2Cpolicy%3Dvideo&key=alice")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil || res.StatusCode != 200 {
		t.Fatalf("%d %v", res.StatusCode, err)
	}
	if b, _ := json.Marshal(body); !strings.Contains(string(b), `"remaining":7`) {
		t.Fatalf("video's usage of alice: %s, want 7 remaining", b)
	}
}

// TestVersion: GET version answers tollgate's release.
func TestVersion(t *testing.T) {
	w := httptest.NewRecorder()
	Handler("/tollgate/").ServeHTTP(w, httptest.NewRequest("GET", "/tollgate/version", nil))
	if w.Code != 200 || w.Body.String() != `{"version":"`+core.Version+`"}`+"\n" {
		t.Errorf("GET version: %d %q", w.Code, w.Body.String())
	}
}

// TestEveryAnswerFieldDocumented: every field name the operators' API
// answers with (each string key of a map this package builds) is in
// docs/operations.md's table of answers, as `name`.
func TestEveryAnswerFieldDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names []string
	for _, file := range []string{"admin.go", "socket.go"} {
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if m, ok := n.Type.(*ast.MapType); ok && fmt.Sprint(m.Key) == "string" {
					for _, el := range n.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							if lit, ok := kv.Key.(*ast.BasicLit); ok {
								names = append(names, lit.Value)
							}
						}
					}
				}
			case *ast.IndexExpr: // lim["burst"] = ...
				if lit, ok := n.Index.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					names = append(names, lit.Value)
				}
			}
			return true
		})
	}
	if len(names) < 20 {
		t.Fatalf("found only %d field names in admin.go: %v", len(names), names)
	}
	for _, quoted := range names {
		name, _ := strconv.Unquote(quoted)
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("the answers' field %q is not in docs/operations.md", name)
		}
	}
}
