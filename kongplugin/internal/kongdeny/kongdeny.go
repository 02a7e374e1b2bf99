// Package kongdeny renders what Kong's own code sends and reads where the
// plugin must match it: a denial as kong.response.error renders it (body
// by Accept, or gRPC status headers), nginx's time variables, and the
// status an upstream answered as Kong's PDK reports it.
package kongdeny

import (
	"encoding/json"
	"fmt"
	"html"
	"strconv"
	"strings"
)

// Denial bodies, in the formats and layout of Kong's kong.response.error
// (which the Kong plugin must match), with the message escaped for each.
const (
	denialJSON  = "{\n  \"message\":%s,\n  \"request_id\":%s\n}"
	denialHTML  = "<!doctype html>\n<html>\n  <head>\n    <meta charset=\"utf-8\">\n    <title>Error</title>\n  </head>\n  <body>\n    <h1>Error</h1>\n    <p>%s.</p>\n    <p>request_id: %s</p>\n  </body>\n</html>\n"
	denialXML   = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<error>\n  <message>%s</message>\n  <requestid>%s</requestid>\n</error>\n"
	denialPlain = "%s\nrequest_id: %s\n"
)

// Content types of the denial formats.
const (
	ContentTypeJSON  = "application/json; charset=utf-8"
	ContentTypeHTML  = "text/html; charset=utf-8"
	ContentTypeXML   = "application/xml; charset=utf-8"
	ContentTypePlain = "text/plain; charset=utf-8"
)

// denialTypes are the media ranges DenialBody knows besides JSON's.
var denialTypes = map[string]string{
	"text/html": ContentTypeHTML, "application/xml": ContentTypeXML,
	"text/plain": ContentTypePlain, "text/*": ContentTypePlain,
}

// grpcStatuses maps HTTP statuses to gRPC codes (GRPCStatus).
var grpcStatuses = map[int]int{400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 429: 8, 499: 1, 500: 13, 501: 12, 503: 14, 504: 4}

// DenialBody renders a denied request's message and request id in the
// format the client's Accept header prefers: JSON (the default, and for any
// type it does not know), HTML, XML or plain text. The media range with the
// highest q wins, the first on a tie; application/* means JSON and text/*
// plain text. It returns the body's Content-Type and the body.
func DenialBody(accept, message, requestID string) (contentType, body string) {
	contentType = ContentTypeJSON
	best := 0.0
	for _, r := range strings.Split(accept, ",") {
		params := strings.Split(r, ";")
		media := strings.ToLower(strings.TrimSpace(params[0]))
		if !strings.Contains(media, "/") {
			continue
		}
		q := 1.0
		for _, p := range params[1:] {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "q="); ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f <= 1 {
					q = f
				}
			}
		}
		if q > best {
			best = q
			contentType = denialTypes[media]
			if contentType == "" {
				contentType = ContentTypeJSON
			}
		}
	}
	switch contentType {
	case ContentTypeHTML:
		return contentType, fmt.Sprintf(denialHTML, html.EscapeString(message), html.EscapeString(requestID))
	case ContentTypeXML:
		return contentType, fmt.Sprintf(denialXML, html.EscapeString(message), html.EscapeString(requestID))
	case ContentTypePlain:
		return contentType, fmt.Sprintf(denialPlain, message, requestID)
	}
	m, _ := json.Marshal(message)
	id, _ := json.Marshal(requestID)
	return contentType, fmt.Sprintf(denialJSON, m, id)
}

// Render renders a denial as Kong's kong.response.error does: for a
// gRPC request (contentType application/grpc...), grpc-status and
// grpc-message headers and no body; else the body Accept prefers (see
// DenialBody), whose Content-Type it sets. accept and requestID are asked
// for only when needed.
func Render(status int, message, contentType string, ask func() (accept, requestID string), set func(name, value string)) (body string) {
	if strings.HasPrefix(contentType, "application/grpc") {
		set("Content-Type", "application/grpc")
		set("Grpc-Status", strconv.Itoa(GRPCStatus(status)))
		set("Grpc-Message", GRPCMessage(message))
		return ""
	}
	accept, requestID := ask()
	ct, body := DenialBody(accept, message, requestID)
	set("Content-Type", ct)
	return body
}

// UpstreamStatus is the status an adaptive policy observes for a
// response Kong's PDK reports with source ("service" or "error") and
// status: 0 (no answer: a timeout or refusal) when Kong made an error
// response below 500 itself.
func UpstreamStatus(source string, status int) int {
	if source == "error" && status < 500 {
		return 0
	}
	return status
}

// GRPCStatus returns the gRPC status code for an HTTP status, as gateways
// map them: 429 is 8 (RESOURCE_EXHAUSTED), 503 is 14 (UNAVAILABLE), other
// 4xx 3 (INVALID_ARGUMENT) and other 5xx 13 (INTERNAL).
func GRPCStatus(status int) int {
	if code, ok := grpcStatuses[status]; ok {
		return code
	}
	if status >= 500 {
		return 13
	}
	return 3
}

// GRPCMessage percent-encodes msg for the grpc-message header, as the gRPC
// protocol requires (bytes outside printable ASCII, and '%').
func GRPCMessage(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}
