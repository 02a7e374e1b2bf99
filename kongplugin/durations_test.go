package kongplugin

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/durationcorpus"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
)

// TestKongWindowsAsTheGrammar: Kong's Admin API (the dumped schema) takes
// exactly the windows the plugin runs, over the corpus every front door
// shares, and refuses the others in the grammar's words, so no config Kong
// stores is refused by the plugin afterwards (issue 71: "1m30" was stored,
// then every request answered 500).
func TestKongWindowsAsTheGrammar(t *testing.T) {
	for _, c := range durationcorpus.Windows {
		config := fmt.Sprintf(`{"limits": [{"count": 5, "window": %q}]}`, c.Text)
		adminErr := schemas[WithResponse]().Check(object(t, config))
		var conf Config
		pluginErr := conf.decode([]byte(config), WithResponse)
		switch {
		case c.Want != 0 && (adminErr != nil || pluginErr != nil):
			t.Errorf("%q: Admin API %v, plugin %v; want both to take it", c.Text, adminErr, pluginErr)
		case c.Want == 0 && (adminErr == nil || pluginErr == nil):
			t.Errorf("%q: Admin API %v, plugin %v; want both to refuse it", c.Text, adminErr, pluginErr)
		case c.Want == 0 && !sameWords(c.Text, adminErr.Error(), pluginErr.Error()):
			t.Errorf("%q: the Admin API says %q, the plugin %q: not algo.ParseWindow's words", c.Text, adminErr, pluginErr)
		}
		if c.Want != 0 && pluginErr == nil {
			if got := conf.compiled.policy.Limits()[0].Window; got != c.Want {
				t.Errorf("%q: the plugin reads %v, want %v", c.Text, got, c.Want)
			}
		}
	}
}

// sameWords: both errors say the refusal algo.ParseWindow gives text (for
// an empty window, Kong's own words).
func sameWords(text, admin, plugin string) bool {
	words := "not a duration (" + algo.DurationExamples + ")"
	if _, err := algo.ParseWindow(text); text == "" {
		words = "length must be at least 1"
	} else if err != nil && strings.HasSuffix(err.Error(), "must be at least 1µs") {
		words = "must be at least 1µs"
	}
	return strings.Contains(admin, words) && strings.Contains(plugin, words)
}

// TestKongWindowPatternsAreTheGrammar: the window field's Lua patterns
// and algo.ParseWindow agree on every string of up to 5 bytes near the
// grammar, and on random strings of its terms up to 24 bytes: Lua
// patterns cannot say "a list of terms", so the patterns forbid each
// local mistake, and this is where a missing one shows.
func TestKongWindowPatternsAreTheGrammar(t *testing.T) {
	field := windowField(t, "window")
	texts := durationcorpus.Strings("019.hmsudoy", 5)
	terms := []string{"1", "9", "0", "9999", "99999", "999999", "9999999", "99999999", "999999999", "999999999999", ".", ".5", ".25", ".125", ".0625",
		"h", "m", "s", "ms", "us", "d", "mo", "y", "o", "u"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50000 {
		var b strings.Builder
		for n := 1 + r.IntN(8); n > 0 && b.Len() < 24; n-- {
			b.WriteString(terms[r.IntN(len(terms))])
		}
		texts = append(texts, b.String())
	}
	mismatches := 0
	for _, text := range texts {
		_, goErr := algo.ParseWindow(text)
		luaErr := field.Check(map[string]any{"window": text})
		if (goErr == nil) != (luaErr == nil) {
			if mismatches++; mismatches <= 20 {
				t.Errorf("%q: ParseWindow %v, Lua patterns %v", text, goErr, luaErr)
			}
		}
	}
	if mismatches > 20 {
		t.Errorf("... %d mismatches in all, of %d strings", mismatches, len(texts))
	}
}

// windowField is a schema of the dumped config's limits[].<name> field alone.
func windowField(t *testing.T, name string) *kongschema.Schema {
	t.Helper()
	var decl struct {
		Fields []map[string]struct {
			Fields []map[string]json.RawMessage `json:"fields"`
		} `json:"fields"`
	}
	if err := json.Unmarshal(schemaJSON, &decl); err != nil {
		t.Fatal(err)
	}
	for _, f := range decl.Fields[0]["config"].Fields {
		if raw, ok := f["limits"]; ok {
			var limits struct {
				Elements struct {
					Fields []map[string]json.RawMessage `json:"fields"`
				} `json:"elements"`
			}
			if err := json.Unmarshal(raw, &limits); err != nil {
				t.Fatal(err)
			}
			for _, lf := range limits.Elements.Fields {
				if w, ok := lf[name]; ok {
					return kongschema.MustParse([]byte(`{"fields": [{"config": {"type": "record", "fields": [{"` + name + `": ` + string(w) + `}]}}]}`))
				}
			}
		}
	}
	t.Fatalf("no limits[].%s in the schema", name)
	return nil
}
