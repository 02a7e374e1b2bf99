# tollgate — `make test` is what CI runs (.ci/run); `make run` serves an
# example on localhost:8080; `make bench` prints the
# `vs <peer> <workload> <factor>` comparisons.

.DEFAULT_GOAL := test

GO        ?= go
FUZZTIME  ?= 5s
PKGS      := ./...

.PHONY: test vet fmt unit fuzz bench bench-core run clean deps

# Until the Caddy module lands (issue 4), `make run` serves the net/http example.
run:
	$(GO) run ./examples/nethttp -addr localhost:8080

test: vet fmt unit fuzz

vet:
	$(GO) vet $(PKGS)
	cd bench && $(GO) vet ./...

# gofmt -l prints files that need formatting; any output fails the build.
fmt:
	@out="$$(gofmt -l . )"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

unit: deps
	$(GO) test -race -count=1 $(PKGS)

# The Redis store's tests start real redis-server processes on loopback.
deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server missing: installing it with apt-get"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } || { \
	    echo "make test needs redis-server and redis-cli: apt-get install -y redis-server"; exit 1; }; }

# Each fuzz target briefly, from its seed corpus (go test runs one target per call).
fuzz:
	$(GO) test ./core -run '^$$' -fuzz '^FuzzStep$$' -fuzztime $(FUZZTIME)
	$(GO) test ./core -run '^$$' -fuzz '^FuzzParseRate$$' -fuzztime $(FUZZTIME)
	$(GO) test ./core -run '^$$' -fuzz '^FuzzHeaders$$' -fuzztime $(FUZZTIME)

# Peers are measured in the same run, in the bench/ module.
bench: bench-core deps
	cd bench && $(GO) run ./compare
	cd bench && $(GO) run ./rediscompare

bench-core:
	$(GO) test -run '^$$' -bench . -benchmem ./core/store/memory/

clean:
	rm -rf bin .tmp
