package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/core/algo"
)

// UnmarshalJSON reads the handler's JSON as Caddy does (unknown fields
// refused). A duration that is not one is refused naming the policy and
// the field it was written in, as the Caddyfile names its file and line:
// encoding/json hands a field's own error back without its place.
func (h *Handler) UnmarshalJSON(b []byte) error {
	type plain Handler // the same fields, without this method
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode((*plain)(h))
	var bad *algo.DurationError
	if !errors.As(err, &bad) {
		return err
	}
	var doc struct {
		Policies []any `json:"policies"`
	}
	var whole any
	if json.Unmarshal(b, &doc) != nil || json.Unmarshal(b, &whole) != nil {
		return err
	}
	for i, p := range doc.Policies {
		if where, ok := pathTo(p, bad.Text); ok {
			name := fmt.Sprintf("policies[%d]", i)
			if n, ok := p.(map[string]any)["name"].(string); ok {
				name = "policy " + strconv.Quote(n)
			}
			return fmt.Errorf("%s %s: %w", name, strings.TrimPrefix(where, "."), err)
		}
	}
	if where, ok := pathTo(whole, bad.Text); ok {
		return fmt.Errorf("%s: %w", strings.TrimPrefix(where, "."), err)
	}
	return err
}

// pathTo finds the first string equal to text in a decoded JSON value,
// names excepted, and returns its path under v: ".limits[0].window".
func pathTo(v any, text string) (string, bool) {
	switch v := v.(type) {
	case string:
		return "", v == text
	case []any:
		for i, e := range v {
			if p, ok := pathTo(e, text); ok {
				return "[" + strconv.Itoa(i) + "]" + p, true
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			if k != "name" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, ok := pathTo(v[k], text); ok {
				return "." + k + p, true
			}
		}
	}
	return "", false
}
