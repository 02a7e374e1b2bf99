// Package dockerfleet holds `make docker-test`: the example fleets of
// examples/caddy and examples/kong run in a real Docker engine, every
// image built on this machine (docker.sh sets the engine up). Its tests
// carry the build tag dockertest, so `go test ./...` does not run them.
package dockerfleet
