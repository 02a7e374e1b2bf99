package kongdeny

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDenialBodyNegotiates(t *testing.T) {
	for accept, want := range map[string]string{
		"":                                  ContentTypeJSON,
		"*/*":                               ContentTypeJSON,
		"image/png, text/html;q=0.9":        ContentTypeJSON, // an unknown type still wins on q, as JSON
		"text/*":                            ContentTypePlain,
		"application/*":                     ContentTypeJSON,
		"TEXT/HTML;level=1":                 ContentTypeHTML,
		"text/plain;q=0.2, text/html;q=0.2": ContentTypePlain, // a tie: the first
		"text/plain;q=0.2, application/xml": ContentTypeXML,
		"garbage":                           ContentTypeJSON,
	} {
		if ct, _ := DenialBody(accept, "m", "id"); ct != want {
			t.Errorf("Accept %q: %s, want %s", accept, ct, want)
		}
	}
	_, body := DenialBody("", `say "no"`, "r1")
	var v struct {
		Message   string `json:"message"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Message != `say "no"` || v.RequestID != "r1" {
		t.Errorf("JSON body %q: %v %+v", body, err, v)
	}
}

func TestGRPCStatusAndMessage(t *testing.T) {
	for status, want := range map[int]int{429: 8, 503: 14, 418: 3, 502: 13, 401: 16} {
		if got := GRPCStatus(status); got != want {
			t.Errorf("GRPCStatus(%d) = %d, want %d", status, got, want)
		}
	}
	if got := GRPCMessage("50% über"); !strings.HasPrefix(got, "50%25 %C3%BC") {
		t.Errorf("GRPCMessage = %q", got)
	}
}
