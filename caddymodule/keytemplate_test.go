package caddymodule

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestFirstQueryValue: the first value of a parameter, exactly as
// url.ParseQuery reads it, without parsing the rest.
func TestFirstQueryValue(t *testing.T) {
	for _, raw := range []string{
		"", "token=t", "token=t&token=zz", "a=1&token=&token=x", "token", "tok%65n=e&token=f", "token=a%20b+c",
		"token=%zz&token=ok", "x;y=1&token=t", "token=a;b&token=c", "a+b=1&token=2", "%zz=1&token=3", "&&token=4&",
	} {
		want := ""
		if vs, _ := url.ParseQuery(raw); len(vs["token"]) > 0 {
			want = vs["token"][0]
		}
		if got := firstQueryValue(raw, "token"); got != want {
			t.Errorf("%q: %q, want %q", raw, got, want)
		}
	}
	if got := firstQueryValue("a+b=1", "a b"); got != "1" {
		t.Errorf("an escaped name: %q", got)
	}
}

// TestUnmapIPv4: an IPv4-mapped IPv6 address keys as its IPv4 address;
// anything else is left as it is.
func TestUnmapIPv4(t *testing.T) {
	for in, want := range map[string]string{
		"::ffff:192.0.2.1": "192.0.2.1", "::FFFF:192.0.2.1": "192.0.2.1", "0:0:0:0:0:ffff:192.0.2.1": "192.0.2.1",
		"192.0.2.1": "192.0.2.1", "2001:db8::1": "2001:db8::1", "::1": "::1", "": "", "not:an.address": "not:an.address",
		"64:ff9b::192.0.2.1": "64:ff9b::192.0.2.1", // NAT64, not mapped
	} {
		if got := unmapIPv4(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// TestSpoofableClientIPReason: the reason Provision refuses a client-IP
// key behind trusted_proxies without trusted_proxies_strict; with strict,
// or keyed on something else, there is none. What a real Caddy does with
// such configs: TestCaddyClientIPTrustedProxies.
func TestSpoofableClientIPReason(t *testing.T) {
	h, err := provision(t, `{"policies":[{"name":"by-ip","limits":[{"count":1,"window":1000000000}]},`+
		`{"name":"by-key","key":"{http.request.header.X-Key}","limits":[{"count":1,"window":1000000000}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	trusted := json.RawMessage(`{"source":"static","ranges":["127.0.0.2/32"]}`)
	for _, tc := range []struct {
		srv  *caddyhttp.Server
		want string
	}{
		{&caddyhttp.Server{}, ""},
		{&caddyhttp.Server{TrustedProxiesRaw: trusted, TrustedProxiesStrict: 1}, ""},
		{&caddyhttp.Server{TrustedProxiesRaw: trusted}, `policy "by-ip": keyed on the client address`},
	} {
		got := spoofableClientIP(tc.srv, h.policies)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("trusted %s strict %d: %q, want %q", tc.srv.TrustedProxiesRaw, tc.srv.TrustedProxiesStrict, got, tc.want)
		}
	}
	if got := spoofableClientIP(&caddyhttp.Server{TrustedProxiesRaw: trusted}, h.policies[1:]); got != "" {
		t.Errorf("a header key warned: %q", got)
	}
}
