package config

import (
	"errors"
	"fmt"

	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
)

// Response is how a gateway answers, as configured (an adapter's
// options): the rate-limit headers, the denial's status and body,
// Retry-After jitter and sampled denial logs.
type Response struct {
	// Headers picks the rate-limit headers: both, ietf, xratelimit, none,
	// per_limit or an adapter's alias; empty means the adapter's default.
	Headers string `json:"headers,omitempty"`
	// Status is the denial status code; 0 means gate.DefaultDenyStatus.
	Status int `json:"status,omitempty"`
	// Body is the denial body; empty means gate.DefaultDenyBody.
	Body string `json:"body,omitempty"`
	// Jitter adds up to this fraction of Retry-After at random (0 to 1).
	Jitter float64 `json:"jitter,omitempty"`
	// LogDenials logs at most this many denials a second (policy, limit,
	// key as the policy shows it, retry-after); 0, the default, logs none.
	LogDenials int `json:"log_denials,omitempty"`
}

// gateConfig checks s and returns the gate settings it describes (and
// its denial logs a second), with style when Headers is empty. styleNames
// are the adapter's own names of header styles (headers.ParseStyle).
func (s *Response) gateConfig(style headers.Style, styleNames map[string]headers.Style) (gate.Config, int, error) {
	if s.Headers != "" {
		var err error
		if style, err = headers.ParseStyle(s.Headers, styleNames); err != nil {
			return gate.Config{}, 0, at("headers", err)
		}
	}
	c := gate.Config{Status: s.Status, Body: s.Body, Headers: headers.Options{Style: style, Jitter: s.Jitter}}
	if err := c.CheckSettings(); err != nil {
		var se *gate.SettingError
		errors.As(err, &se)
		return gate.Config{}, 0, at(se.Field, err)
	}
	if s.LogDenials < 0 {
		return gate.Config{}, 0, at("log_denials", fmt.Errorf("log_denials: %d must not be negative", s.LogDenials))
	}
	return c, s.LogDenials, nil
}
