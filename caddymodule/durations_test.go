package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/durationcorpus"
)

// TestCaddyWindowsAsTheGrammar runs the corpus of windows every front
// door shares through Caddy's two: the Caddyfile (`limit 5/<window>`,
// which reads as algo.ParseRate does: the grammar, plus unit names such as
// 5/minute and spaces around the parts) and JSON ("window": "<window>",
// which reads as algo.ParseWindow). Each takes what its Go reading takes
// and refuses the rest in the same words, naming where it was written.
func TestCaddyWindowsAsTheGrammar(t *testing.T) {
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	for _, c := range durationcorpus.Windows {
		// The Caddyfile, quoted so that any text is one token.
		caddyfileText := fmt.Sprintf(":8080 {\n\ttollgate {\n\t\tpolicy a {\n\t\t\tlimit %q\n\t\t}\n\t}\n}\n", "5/"+c.Text)
		_, _, adaptErr := adapter.Adapt([]byte(caddyfileText), map[string]any{"filename": "Caddyfile"})
		_, _, rateErr := algo.ParseRate("5/" + c.Text)
		switch {
		case (adaptErr == nil) != (rateErr == nil):
			t.Errorf("Caddyfile %q: %v, algo.ParseRate %v", c.Text, adaptErr, rateErr)
		case adaptErr != nil && (!strings.Contains(adaptErr.Error(), rateErr.Error()) || !strings.Contains(adaptErr.Error(), "Caddyfile:4")):
			t.Errorf("Caddyfile %q: %v, want ParseRate's words (%v) at Caddyfile:4", c.Text, adaptErr, rateErr)
		}

		// JSON.
		_, jsonErr := provisionJSON(fmt.Sprintf(`{"policies":[{"name":"a","limits":[{"count":5,"window":"1m","algorithm":"fixed_window"},{"count":9,"window":%q}]}]}`, c.Text))
		_, windowErr := algo.ParseWindow(c.Text)
		switch {
		case (jsonErr == nil) != (windowErr == nil):
			t.Errorf("JSON %q: %v, algo.ParseWindow %v", c.Text, jsonErr, windowErr)
		case jsonErr != nil && strings.Contains(windowErr.Error(), algo.NotADuration) &&
			!strings.Contains(jsonErr.Error(), `policy "a" limits[1].window: `+fmt.Sprintf("%q: ", c.Text)+algo.NotADuration):
			t.Errorf("JSON %q: %v, want the policy, the field and the grammar's words", c.Text, jsonErr)
		case jsonErr != nil && strings.HasSuffix(windowErr.Error(), "must be at least 1µs") &&
			!strings.Contains(jsonErr.Error(), `policy "a" limit 2: window: 0s must be at least 1µs`):
			t.Errorf("JSON %q: %v, want the policy, the limit and the range", c.Text, jsonErr)
		}
	}
}

// provisionJSON loads raw as Caddy loads a handler's JSON (strict
// decoding, then Provision and Validate) and cleans up; its error is
// Caddy's, whichever step gave it.
func provisionJSON(raw string) (*Handler, error) {
	var h Handler
	if err := caddyStrictUnmarshal([]byte(raw), &h); err != nil {
		return nil, err
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	err := h.Provision(ctx)
	if err == nil {
		err = h.Validate()
	}
	_ = h.Cleanup()
	return &h, err
}

// caddyStrictUnmarshal decodes as Caddy decodes a module's config.
func caddyStrictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
