package kongschema

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestLuaPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"^[%w_%-]+$", "X-Api_Key-2", true},
		{"^[%w_%-]+$", "bad header", false},
		{"^[%w_%-]+$", "x:y", false},
		{"^[%w_%-]+$", "", false},
		{"//", "/a//b", true},
		{"//", "/a/b", false},
		{"^/[%w%.%-%_~%/%%]*$", "/login/v1.2_~%41", true},
		{"^/[%w%.%-%_~%/%%]*$", "/log in", false},
		{"%%%X", "/a%zz", true},
		{"%%%X", "/a%41", false},
		{"%%%x%X", "/a%4z", true},
		{"%%%x?$", "/a%4", true},
		{"%%%x?$", "/a%", true},
		{"%%%x?$", "/a%41", false},
		{"^.+:%d+$", "redis-1:6379", true},
		{"^.+:%d+$", "redis-1", false},
		{"a.-b", "axxbyyb", true},
		{"^[^%d]+$", "abc", true},
		{"^[^%d]+$", "ab1", false},
		{"^[a-c]+$", "abc", true},
		{"^[a-c]+$", "abd", false},
		{"^%u%l*$", "Minute", true},
		{"^%u%l*$", "minute", false},
		{"^%a+%s?%d$", "abc 1", true},
		{"x$", "x\n", false}, // $ is the end, not before a newline
	} {
		re, err := luaPattern(tc.pattern)
		if err != nil {
			t.Errorf("%q: %v", tc.pattern, err)
			continue
		}
		if got := re.MatchString(tc.s); got != tc.want {
			t.Errorf("%q on %q: %v, want %v (as %s)", tc.pattern, tc.s, got, tc.want, re)
		}
	}
	for _, bad := range []string{"(%d+)", "%b()", "%f[%w]", "[abc", "abc%", "%z"} {
		if _, err := luaPattern(bad); err == nil {
			t.Errorf("%q compiled; this package cannot check it", bad)
		}
	}
}

// testSchema has one of each construct Check implements.
const testSchema = `{"fields": [{"config": {"type": "record", "required": true, "fields": [
  {"mode": {"type": "string", "default": "a", "one_of": ["a", "b"]}},
  {"name": {"type": "string"}},
  {"maybe_empty": {"type": "string", "len_min": 0}},
  {"count": {"type": "integer", "between": [0, 10]}},
  {"rate": {"type": "number", "gt": 0}},
  {"path": {"type": "string", "starts_with": "/", "match_none": [{"pattern": "//", "err": "must not have empty segments"}]}},
  {"word": {"type": "string", "match_all": [{"pattern": "^%a+$"}]}},
  {"always": {"type": "record", "required": true, "fields": [{"port": {"type": "integer", "default": 6379}}]}},
  {"sometimes": {"type": "record", "required": false, "fields": [{"on": {"type": "boolean", "default": true}}]}},
  {"unsaid": {"type": "record", "fields": [{"on": {"type": "boolean", "default": true}}, {"inner": {"type": "record", "fields": [{"n": {"type": "integer", "default": 3}}]}}]}},
  {"list": {"type": "array", "elements": {"type": "record", "fields": [{"n": {"type": "integer", "required": true}}]}}}
]}}],
"entity_checks": [
  {"at_least_one_of": ["config.count", "config.list"]},
  {"conditional": {"if_field": "config.mode", "if_match": {"eq": "b"}, "then_field": "config.name", "then_match": {"required": true}}},
  {"conditional": {"if_field": "config.mode", "if_match": {"eq": "b"}, "then_field": "config.rate", "then_match": {"gt": 1}, "then_err": "rate must be above 1 in mode b"}},
  {"conditional_at_least_one_of": {"if_field": "config.mode", "if_match": {"eq": "a"}, "then_at_least_one_of": ["config.word", "config.path"], "then_err": "must set one of %s in mode a"}}
]}`

func TestCheckAsKong(t *testing.T) {
	s, err := Parse([]byte(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	check := func(config string) (map[string]any, string) {
		var m map[string]any
		if err := json.Unmarshal([]byte(config), &m); err != nil {
			t.Fatal(err)
		}
		if err := s.Check(m); err != nil {
			return m, err.Error()
		}
		return m, ""
	}
	// Defaults: filled for null and absent fields; a required record is
	// expanded with its own defaults; one that says `required: false` stays
	// null. A record that does not say is required, at any depth: Kong
	// 3.9.3's Entity.new_subschema runs make_records_required on a plugin's
	// schema (kong/db/schema/entity.lua), so Kong stores such a record with
	// its defaults on every config.
	m, msg := check(`{"count": 1, "word": "x", "mode": null, "sometimes": null}`)
	if msg != "" {
		t.Fatal(msg)
	}
	if m["mode"] != "a" || m["always"].(map[string]any)["port"] != float64(6379) || m["sometimes"] != nil {
		t.Errorf("defaults: %v", m)
	}
	unsaid, _ := m["unsaid"].(map[string]any)
	if inner, _ := unsaid["inner"].(map[string]any); unsaid["on"] != true || inner["n"] != float64(3) {
		t.Errorf("a record that does not say required is filled from its defaults as Kong fills it, at every depth: %v", m["unsaid"])
	}
	if _, msg := check(`{"count": 1, "word": "x", "sometimes": {}}`); msg != "" {
		t.Errorf("an optional record given: %s", msg)
	}
	for _, tc := range []struct{ config, want string }{
		{`{"count": 1, "word": "x", "name": ""}`, `config.name: length must be at least 1 (got "")`},
		{`{"count": 1, "word": "x", "maybe_empty": ""}`, ``},
		{`{"count": 11, "word": "x"}`, `config.count: value should be between 0 and 10 (got 11)`},
		{`{"count": 1.5, "word": "x"}`, `config.count: expected an integer (got 1.5)`},
		{`{"count": "1", "word": "x"}`, `config.count: expected an integer (got "1")`},
		{`{"count": 1, "word": "x", "rate": 0}`, `config.rate: value must be greater than 0 (got 0)`},
		{`{"count": 1, "word": "x", "mode": "c"}`, `config.mode: expected one of: a, b (got "c")`},
		{`{"count": 1, "path": "a"}`, `config.path: should start with: / (got "a")`},
		{`{"count": 1, "path": "/a//b"}`, `config.path: must not have empty segments (got "/a//b")`},
		{`{"count": 1, "word": "x1"}`, `config.word: invalid value: x1 (got "x1")`},
		{`{"count": 1, "word": "x", "always": {"port": true}}`, `config.always.port: expected an integer (got true)`},
		{`{"list": [{"n": 1}, {}], "word": "x"}`, `config.list[1].n: required field missing`},
		{`{"list": [null], "word": "x"}`, `config.list[0]: required field missing`},
		{`{"list": [], "word": "x"}`, `at least one of these fields must be non-empty: 'config.count', 'config.list'`},
		{`{"count": 1, "mode": "b", "rate": 2}`, `config.name: required field missing (failed conditional validation given value of field 'config.mode')`},
		{`{"count": 1, "mode": "b", "name": "n", "rate": 0.5}`, `config.rate: rate must be above 1 in mode b (got 0.5)`},
		{`{"count": 1, "mode": "b", "name": "n", "rate": 2}`, ``},
		{`{"count": 1}`, `must set one of 'config.word', 'config.path' in mode a`},
		{`{"count": 1, "word": ""}`, `config.word: length must be at least 1 (got ""); must set one of 'config.word', 'config.path' in mode a`},
	} {
		if _, msg := check(tc.config); msg != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.config, msg, tc.want)
		}
	}
}

func TestParseRefusesWhatItCannotCheck(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"fields": [{"config": {"type": "string", "custom_validator": "f"}}]}`, `unknown field "custom_validator"`},
		{`{"fields": [{"config": {"type": "string", "len_max": 3}}]}`, `unknown field "len_max"`},
		{`{"fields": [{"config": {"type": "string"}}], "entity_checks": [{"only_one_of": ["config"]}]}`, `unknown field "only_one_of"`},
		{`{"fields": [{"config": {"type": "string"}}], "entity_checks": [{"at_least_one_of": ["config.x"]}]}`, `names "config.x", which is not declared`},
		{`{"fields": [{"config": {"type": "integer", "default": 5, "between": [0, 3]}}]}`, `default 5 fails its own field`},
		{`{"fields": [{"config": {"type": "string", "match_all": [{"pattern": "(x)"}]}}]}`, `captures are not supported`},
		{`{"fields": [{"config": {"type": "string"}}], "entity_checks": [{}]}`, `an entity check of no kind`},
	} {
		if _, err := Parse([]byte(tc.schema)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.schema, err, tc.want)
		}
	}
}

func TestDumpIsTheDeclaration(t *testing.T) {
	s, err := Parse([]byte(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.Dump(&out, Info{Name: "p", Version: "1", Priority: 5, Phases: []string{"access"}, Socket: "/k/p.socket"}); err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Protocol, SocketPath string
		Plugins              []struct {
			Name, Version string
			Priority      int
			Phases        []string
			Schema        map[string]any
		}
	}
	if err := json.Unmarshal(out.Bytes(), &dump); err != nil {
		t.Fatal(err)
	}
	var declared map[string]any
	_ = json.Unmarshal([]byte(testSchema), &declared)
	declared["name"] = "p"
	p := dump.Plugins[0]
	got, _ := json.Marshal(p.Schema)
	want, _ := json.Marshal(declared)
	if dump.Protocol != "ProtoBuf:1" || dump.SocketPath != "/k/p.socket" || p.Name != "p" || p.Priority != 5 || !bytes.Equal(got, want) {
		t.Errorf("dump %s\nwant schema %s", out.Bytes(), want)
	}
}

// TestConditionalIfFieldInNullRecord: Kong requires a conditional's
// if_field (kong/db/schema/init.lua, run_entity_check with the checker's
// required_fields); a field inside a null record is missing, and Kong
// answers "field required for entity check" (as Kong's own schema code
// printed for such a dump, through ../shared/kong-schema).
func TestConditionalIfFieldInNullRecord(t *testing.T) {
	s := MustParse([]byte(`{"fields": [{"config": {"type": "record", "required": true, "fields": [
  {"mode": {"type": "string", "default": "a"}},
  {"inner": {"type": "record", "required": false, "fields": [{"on": {"type": "boolean", "default": true}}]}}]}}],
 "entity_checks": [{"conditional": {"if_field": "config.inner.on", "if_match": {"eq": true},
   "then_field": "config.mode", "then_match": {"eq": "a"}}}]}`))
	if err := s.Check(map[string]any{"mode": "a"}); err == nil || !strings.Contains(err.Error(), "config.inner.on: field required for entity check") {
		t.Errorf("null record: %v, want Kong's field required for entity check", err)
	}
	if err := s.Check(map[string]any{"mode": "a", "inner": map[string]any{}}); err != nil {
		t.Errorf("record given: %v", err)
	}
}
