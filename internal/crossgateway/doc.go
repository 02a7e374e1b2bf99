// Package crossgateway holds the tests that run more than one gateway at
// once: Caddy (the xcaddy-built binary) and the Kong plugin server sharing
// one Redis, as a mixed fleet runs them. Each gateway's own end-to-end
// tests stay beside its adapter.
package crossgateway
