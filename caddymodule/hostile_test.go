package caddymodule_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/redistest"
)

// TestCaddyHostileRequests: through a real Caddy, on the memory store and
// on a real redis-server, a client that has used its quota cannot get a
// fresh bucket by reshaping what its key is read from: repeating the key's
// header or query parameter (the first value keys, as the upstream's
// Header.Get reads it), escaping the parameter's name, writing its address
// as an IPv4-mapped IPv6 address, or prepending addresses to
// X-Forwarded-For behind a trusted proxy with trusted_proxies_strict.
// Every case is a request sent after its key's quota of 3 is spent: each
// must be refused.
func TestCaddyHostileRequests(t *testing.T) {
	rs := redistest.StartT(t)
	cases := []hostileCase{
		{"a repeated key header", hostileRequest{"/h", http.Header{"X-Key": {"k"}}}, []hostileRequest{
			{"/h", http.Header{"X-Key": {"k", "k"}}},
			{"/h", http.Header{"X-Key": {"k", "other"}}},
			{"/h", http.Header{"X-Key": {"k", ""}}},
		}},
		{"a repeated query parameter", hostileRequest{"/q?token=t", nil}, []hostileRequest{
			{"/q?token=t&token=zz", nil},
			{"/q?token=t&token=t", nil},
			{"/q?tok%65n=t", nil},
			{"/q?x=1&token=t&token=", nil},
			{"/q?token=%74", nil},
		}},
		{"a client address written another way", hostileRequest{"/ip", http.Header{"X-Forwarded-For": {"203.0.113.9"}}}, []hostileRequest{
			{"/ip", http.Header{"X-Forwarded-For": {"::ffff:203.0.113.9"}}},
			{"/ip", http.Header{"X-Forwarded-For": {"::FFFF:cb00:7109"}}},
			{"/ip", http.Header{"X-Forwarded-For": {"10.9.9.1, 203.0.113.9"}}},
			{"/ip", http.Header{"X-Forwarded-For": {"10.9.9.1", "203.0.113.9"}}},
		}},
	}
	tried := 0
	for _, store := range []string{"memory", "redis redis://" + rs.Addr} {
		t.Run(strings.Fields(store)[0], func(t *testing.T) { tried += hostileRefused(t, store, cases) })
	}
	t.Logf("%d hostile requests refused", tried)
}

// hostileCase is a quota spent (spend, sent 3 times), then requests that
// must be refused.
type hostileCase struct {
	name  string
	spend hostileRequest
	try   []hostileRequest
}

// hostileRequest is a path and its headers.
type hostileRequest struct {
	path   string
	header http.Header
}

// hostileRefused runs the cases on a Caddy in process over store and
// returns how many hostile requests it sent.
func hostileRefused(t *testing.T, store string, cases []hostileCase) (tried int) {
	c := caddyproc.StartGlobalInProcess(t, "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict\n\t}", fmt.Sprintf(`
tollgate {
	store %s
	policy by-header {
		match {
			path /h
		}
		key {http.request.header.X-Key}
		limit 3/1m sliding_log
	}
	policy by-query {
		match {
			path /q
		}
		key {http.request.uri.query.token}
		limit 3/1m gcra burst 3
	}
	policy by-ip {
		match {
			path /ip
		}
		limit 3/1m
	}
}
respond "ok"`, store))
	send := func(r hostileRequest) int {
		req, err := http.NewRequest(http.MethodGet, c.URL+r.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = r.header.Clone()
		if req.Header == nil {
			req.Header = http.Header{}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range cases {
		for i := 0; i < 3; i++ {
			if code := send(tc.spend); code != 200 {
				t.Fatalf("store %s, %s: request %d of the quota answered %d", store, tc.name, i+1, code)
			}
		}
		for _, r := range tc.try {
			tried++
			if code := send(r); code != http.StatusTooManyRequests {
				t.Errorf("store %s, %s: %s with %v answered %d after the quota was spent, want 429", store, tc.name, r.path, r.header, code)
			}
		}
	}
	// And the limit still tells clients apart: another key is allowed.
	if code := send(hostileRequest{"/h", http.Header{"X-Key": {"other"}}}); code != 200 {
		t.Errorf("store %s: another client's key answered %d", store, code)
	}
	return tried
}
