package kongreal

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Answer is what a client got from Kong: the status, the headers a rate
// limiter writes (every X-RateLimit-*, RateLimit-*, Retry-After,
// Content-Type and grpc-*) and the X-Probe-* headers tests have other
// plugins set, and the body with Kong's request ids masked.
type Answer struct {
	Status  int
	Headers http.Header
	Body    string
	// Sent and Got are when the request went out and the answer came
	// back, on this process's clock.
	Sent, Got time.Time
}

// limiterHeader reports whether a response header is one a rate limiter
// (or the denial it writes) sets, or a test's probe.
func limiterHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-ratelimit-") || strings.HasPrefix(n, "ratelimit-") || n == "retry-after" ||
		n == "content-type" || strings.HasPrefix(n, "grpc-") || strings.HasPrefix(n, "x-probe-")
}

var requestID = regexp.MustCompile(`[0-9a-f]{32}`)

// h2c is a client that speaks HTTP/2 without TLS.
var h2c = func() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}()

// Get sends one request through Kong's proxy and returns what came back.
// headers are request header lines ("Name: value").
func (k *Kong) Get(path string, headers ...string) Answer {
	k.t.Helper()
	return k.get(http.DefaultClient, k.ProxyURL+path, headers)
}

// GetH2 is Get over HTTP/2 (h2c).
func (k *Kong) GetH2(path string, headers ...string) Answer {
	k.t.Helper()
	return k.get(h2c, k.H2URL+path, headers)
}

// GetOnce is Get on a connection of its own, closed after the answer:
// Kong 3.9.3's response-ratelimiting, refusing a response in its
// header_filter, sends the upstream's body after a Content-Length of 0,
// and the next answer read on that connection would begin with it.
func (k *Kong) GetOnce(path string, headers ...string) Answer {
	k.t.Helper()
	return k.get(nil, k.ProxyURL+path, headers)
}

func (k *Kong) get(client *http.Client, url string, headers []string) Answer {
	k.t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		k.t.Fatal(err)
	}
	if client == nil {
		client, req.Close = http.DefaultClient, true
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		if value = strings.TrimSpace(value); value != "" {
			req.Header.Add(strings.TrimSpace(name), value)
		}
	}
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	a := Answer{Status: resp.StatusCode, Headers: http.Header{}, Body: requestID.ReplaceAllString(string(body), "<request id>"),
		Sent: sent, Got: time.Now()}
	for name, v := range resp.Header {
		if limiterHeader(name) {
			a.Headers[name] = v
		}
	}
	return a
}

// String is the answer on one line, headers sorted.
func (a Answer) String() string {
	var names []string
	for n := range a.Headers {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	fmt.Fprintf(&b, "%d", a.Status)
	for _, n := range names {
		fmt.Fprintf(&b, " %s=%s", n, strings.Join(a.Headers[n], ","))
	}
	if a.Body != "" && a.Body != "ok\n" {
		fmt.Fprintf(&b, " body=%q", a.Body)
	}
	return b.String()
}

// secondsHeaders count seconds to a window's end: two requests sent a
// clock tick apart read one second apart.
var secondsHeaders = map[string]bool{"Ratelimit-Reset": true, "Retry-After": true}

// Diff lists how b, sent after a, differs from a: the status, each
// limiter header (by name; values compared as lists), and the body. A
// header counting seconds to the window's end may read one less in b when
// a wall-clock second began between a's sending and b's answer.
func Diff(a, b Answer) []string {
	var out []string
	ticked := a.Sent.Unix() != b.Got.Unix()
	if a.Status != b.Status {
		out = append(out, fmt.Sprintf("status %d vs %d", a.Status, b.Status))
	}
	names := map[string]bool{}
	for n := range a.Headers {
		names[n] = true
	}
	for n := range b.Headers {
		names[n] = true
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	for _, n := range sorted {
		if secondsHeaders[n] && ticked && len(a.Headers[n]) == 1 && len(b.Headers[n]) == 1 {
			x, errA := strconv.Atoi(a.Headers[n][0])
			y, errB := strconv.Atoi(b.Headers[n][0])
			if errA == nil && errB == nil && x-y == 1 {
				continue
			}
		}
		if !slices.Equal(a.Headers[n], b.Headers[n]) {
			out = append(out, fmt.Sprintf("%s %q vs %q", n, a.Headers[n], b.Headers[n]))
		}
	}
	if a.Body != b.Body {
		out = append(out, fmt.Sprintf("body %q vs %q", a.Body, b.Body))
	}
	return out
}
