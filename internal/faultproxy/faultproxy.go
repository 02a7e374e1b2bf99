// Package faultproxy runs a real Toxiproxy (github.com/Shopify/toxiproxy,
// in process) between a test's clients and a TCP server on loopback, so
// tests can inject the faults a real network makes: latency and jitter,
// connections that accept and never answer, resets, slow closes, replies
// cut short or sliced into small pieces.
package faultproxy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	_ "github.com/Shopify/toxiproxy/v2/toxics" // registers the toxic types
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy forwards connections on Addr to its upstream, through the toxics
// added to it.
type Proxy struct {
	// Addr is where clients connect instead of the upstream.
	Addr  string
	proxy *toxiproxy.Proxy
	t     testing.TB
}

// Start listens on a free loopback port and forwards to upstream
// ("host:port") until the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "fault-"+strings.ReplaceAll(t.Name(), "/", "-"), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{Addr: p.Listen, proxy: p, t: t}
}

// Add adds a toxic named name of type kind (latency, timeout, reset_peer,
// slow_close, limit_data, slicer, bandwidth) on stream (upstream: towards
// the server, downstream: its replies) with Toxiproxy's attributes; it
// applies to open connections too.
func (p *Proxy) Add(name, kind, stream string, attributes map[string]any) {
	p.t.Helper()
	b, _ := json.Marshal(map[string]any{"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes})
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(string(b))); err != nil {
		p.t.Fatalf("toxiproxy: adding %s %s: %v", kind, name, err)
	}
}

// Remove removes the toxic named name.
func (p *Proxy) Remove(name string) {
	p.t.Helper()
	if err := p.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		p.t.Fatalf("toxiproxy: removing %s: %v", name, err)
	}
}

// Cut partitions the link: nothing gets through in either direction, and
// connections stay open (a timeout toxic of 0 on both streams), as when a
// network drops packets. Heal undoes it.
func (p *Proxy) Cut() {
	p.Add("cut-up", "timeout", "upstream", map[string]any{"timeout": 0})
	p.Add("cut-down", "timeout", "downstream", map[string]any{"timeout": 0})
}

// Heal ends a Cut.
func (p *Proxy) Heal() {
	p.Remove("cut-up")
	p.Remove("cut-down")
}
