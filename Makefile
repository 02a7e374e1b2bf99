# tollgate — `make test` is what CI runs (.ci/run); `make run` serves an
# example on localhost:8080; `make bench` prints the
# `vs <peer> <workload> <factor>` comparisons.

.DEFAULT_GOAL := test

GO        ?= go
FUZZTIME  ?= 5s
PKGS      := ./...
CADDY_VERSION := v2.11.9
# staticcheck, pinned (make test runs it beside go vet). It loads every
# package's export data through `go list -export`: with GOFLAGS=-race that
# is the race build go vet -race has just compiled, where a plain build
# compiled Caddy's whole tree a second time (about 5 of a cold make test's
# minutes).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# What bin/caddy is built from: rebuilt when any of it changes (the Lua
# scripts are embedded in core).
CADDY_SRC := $(shell find core caddymodule \( -name '*.go' ! -name '*_test.go' -o -name '*.lua' \)) tollgate.go go.mod go.sum

.PHONY: test kong-test kong-spec kong vet govet staticcheck fmt acl unit fuzz fuzz-short mutants bench bench-core bench-caddy bench-kong bench-kong-socket adaptive adaptive-short adaptive-fleet chaos plots run clean deps monitoring docker-test bench-instructions

# Caddy with tollgate on the memory store, serving Caddyfile.example on
# http://localhost:8080 (admin API on localhost:2019).
run: bin/caddy
	./bin/caddy run --config Caddyfile.example --adapter caddyfile

# Caddy v2.11.9 with the tollgate module, built by xcaddy (a tool dependency
# in go.mod). The local module needs a version (@v0.0.0=) or xcaddy asks the
# module proxy for its versions. About 3-5 minutes cold on 2 cores.
bin/caddy: $(CADDY_SRC)
	@mkdir -p bin
	$(GO) tool xcaddy build $(CADDY_VERSION) --output $@ --with github.com/tollgate/tollgate@v0.0.0=$(CURDIR)

# The Caddy the integration tests run: the same build with the race
# detector, so a data race in the module inside a real Caddy fails the
# tests. Built with go's default flags (XCADDY_GO_BUILD_FLAGS replaces
# xcaddy's -trimpath, -ldflags and tags), it compiles Caddy's tree exactly
# as `go vet -race` and the tests do: a cold make test compiles it once.
bin/caddy-race: $(CADDY_SRC)
	@mkdir -p bin
	XCADDY_RACE_DETECTOR=1 XCADDY_GO_BUILD_FLAGS=-buildvcs=false \
	  $(GO) tool xcaddy build $(CADDY_VERSION) --output $@ --with github.com/tollgate/tollgate@v0.0.0=$(CURDIR)

# unit runs last: its final line counts every test of every package as
# "N passed, N failed, N skipped". Before it, once go vet -race has
# compiled the tree, staticcheck (which reads that build), bin/caddy-race
# (mostly resolving modules, cold) and the adaptive benchmark's short form
# (a simulation on a virtual clock) run side by side. The planted bugs are `make
# mutants`, which CI runs after make test: they relink a test binary per
# bug, six minutes of a cold machine.
test: fmt
	$(MAKE) --no-print-directory govet
	$(MAKE) --no-print-directory -j3 staticcheck bin/caddy-race adaptive-short
	$(MAKE) --no-print-directory unit

# Instructions per decision under valgrind's callgrind, tollgate against
# each in-process peer and the floor, on one core: the comparison that
# holds on every CPU (cd bench && go run ./compare -instructions); then
# the Caddy handler's instructions per request against the header floor
# and caddy-ratelimit (cd bench && go run ./caddyinprocess -instructions).
bench-instructions:
	@command -v valgrind >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }
	cd bench && $(GO) build -o $(CURDIR)/bin/compare ./compare && $(CURDIR)/bin/compare -instructions
	cd bench && $(GO) build -o $(CURDIR)/bin/caddyinprocess ./caddyinprocess && $(CURDIR)/bin/caddyinprocess -instructions

# Real Kong Gateway 3.9 in the loop: the Kong on PATH, or one installed
# from KONG_REAL (Kong 3.9.3 built for these machines; CI has it beside the
# checkout) when there is none, and Debian's postgresql for its DB mode. The
# tests start Kong DB-less (and once on a Postgres of their own) with the
# three plugin servers registered with docs/kong.md's own lines, and run Kong's
# bundled rate-limiting and response-ratelimiting beside tollgate on the
# same traffic (internal/kongreal). CI runs it after make test.
KONG_REAL ?= ../shared/kong-real
KONG_PATH := /usr/local/openresty/bin:/usr/local/openresty/nginx/sbin:$(PATH)
kong: deps
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "postgresql missing (Kong's DB mode in make kong-test): installing it with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }
	@PATH=$(KONG_PATH); if command -v kong >/dev/null 2>&1 && kong version 2>/dev/null | grep -q '^3\.9'; then \
	  echo "kong $$(kong version) on PATH"; \
	elif [ -f $(KONG_REAL)/install.sh ]; then bash $(KONG_REAL)/install.sh; \
	else echo "make kong-test needs Kong 3.9 on PATH (a Kong package or the kong:3.9 image)"; exit 1; fi

kong-test: kong
	@$(GO) run ./internal/fixedports -reserve $(KONG_SPEC_PORTS)
	@{ PATH=$(KONG_PATH) $(GO) test -race -vet=off -tags kongreal -count=1 -json ./internal/kongreal/ 2>&1; echo "go test exit $$?"; } | $(GO) run ./internal/testsummary

# Kong 3.9.3's own busted specs for its rate-limiting and
# response-ratelimiting plugins, run by KONG_SPEC_RUN on Kong's plugins and
# on tollgate's drop-ins (built from this checkout), with Kong's harness,
# Postgres and Redis; Kong's lua_ssl_trusted_certificate is the plugin
# servers' only trust (KONGSPEC_TOLLGATE_CA empty). Fails when a test that
# passes on Kong's plugin does not pass on tollgate's, unless docs/kong.md
# lists it (internal/kongspec). A tollgate test whose request reached a
# plugin server before it listened (Kong 3.9.3 answers it 500: its specs
# send a request as soon as Kong starts) is run again alone, up to
# KONG_SPEC_ATTEMPTS times, and must pass. About 20 minutes on 2 cores.
# CI runs it after make kong-test.
#
# The run's Postgres and Redis listen on fixed ports inside the kernel's
# ephemeral range, and a connection closed shortly before from one of them
# (make kong-test opens thousands) holds it in TIME_WAIT for 60 s, when
# Postgres cannot bind it: internal/fixedports reserves them from that
# range before make kong-test (net.ipv4.ip_local_reserved_ports, until
# reboot) and waits here until none but a listener holds them.
KONG_SPEC_RUN ?= ../shared/kong-spec/run.sh
KONG_SPECS ?= rl rrl rl-schema rrl-schema rl-api rrl-api rl-shorthand rrl-shorthand rl-integration rrl-integration
KONG_SPEC_WORK ?= /tmp/kongspec
KONG_SPEC_ATTEMPTS ?= 12
KONG_SPEC_PG_PORT ?= 55432
KONG_SPEC_REDIS_PORT ?= 36379
KONG_SPEC_REDIS_SSL_PORT ?= 36380
KONG_SPEC_PORTS = $(KONG_SPEC_PG_PORT) $(KONG_SPEC_REDIS_PORT) $(KONG_SPEC_REDIS_SSL_PORT)
KONG_SPEC_ENV = KONGSPEC_TOLLGATE_CA= KONGSPEC_WORK=$(KONG_SPEC_WORK) KONGSPEC_PG_PORT=$(KONG_SPEC_PG_PORT) \
	KONGSPEC_REDIS_PORT=$(KONG_SPEC_REDIS_PORT) KONGSPEC_REDIS_SSL_PORT=$(KONG_SPEC_REDIS_SSL_PORT)
kong-spec: kong
	@test -f $(KONG_SPEC_RUN) || { echo "make kong-spec needs Kong's spec runner at $(KONG_SPEC_RUN) (KONG_SPEC_RUN=...)"; exit 1; }
	@$(GO) run ./internal/fixedports -reserve -wait 150s $(KONG_SPEC_PORTS)
	rm -f $(KONG_SPEC_WORK)/logs/baseline-*.log $(KONG_SPEC_WORK)/logs/tollgate-*.log
	KONGSPEC_SPECS="$(KONG_SPECS)" $(KONG_SPEC_ENV) bash $(KONG_SPEC_RUN)
	$(KONG_SPEC_ENV) $(GO) run ./internal/kongspec -logs $(KONG_SPEC_WORK)/logs -specs "$(KONG_SPECS)" \
		-rerun $(KONG_SPEC_RUN) -attempts $(KONG_SPEC_ATTEMPTS) docs/kong.md

# The example fleets (examples/caddy, examples/kong) in a real Docker
# engine, every image built here: installs docker.io and busybox-static
# when missing, starts dockerd when none runs (and stops only that one),
# and builds Docker Compose v2 from the Go module proxy when `docker
# compose` is missing. CI runs it after make test.
docker-test: deps
	KONG_REAL=$(KONG_REAL) bash internal/dockerfleet/docker.sh

# The Redis stores' suites alone, connected as tollgate's least-privilege
# Redis user (core/store/redis/acl) on standalone, Sentinel and Cluster:
# every command tollgate sends, and every one its scripts call, is
# allowed. make test runs them so too (unit sets TOLLGATE_REDIS_ACL).
acl: deps
	TOLLGATE_REDIS_ACL=1 $(GO) test -race -count=1 ./core/store/ ./core/store/redis/

# -race compiles the dependencies as the unit tests will, so the two share
# the build cache (a cold make test compiles Caddy's tree once for both).
vet: govet
	$(MAKE) --no-print-directory staticcheck

govet:
	$(GO) vet -race $(PKGS)
	$(GO) vet -race -tags tollgate_testclock ./core/openstore/
	$(GO) vet -race -tags dockertest ./internal/dockerfleet/
	$(GO) vet -race -tags kongreal ./internal/kongreal/
	$(GO) vet -race -tags tollgate_testpanic ./kongplugin/
	cd bench && $(GO) vet -race ./...

staticcheck:
	GOBIN=$(CURDIR)/bin $(GO) install $(STATICCHECK)
	GOFLAGS=-race bin/staticcheck -tags kongreal,dockertest ./...
	cd bench && GOFLAGS=-race ../bin/staticcheck ./...

# gofmt -l prints files that need formatting; any output fails the build.
fmt:
	@out="$$(gofmt -l . )"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The Caddy integration tests run bin/caddy-race; TOLLGATE_REQUIRE_CADDY
# makes a missing binary a failure rather than a skip. TOLLGATE_REDIS_ACL
# runs the Redis stores' suites as the least-privilege Redis user (the
# other packages' Redis servers have only the default user).
# The two longest packages are named first, so go test starts them first
# and no slot is left running one of them alone at the end.
# -vet=off: make test runs unit after vet, whose analyzers are a superset of
# go test's on the same packages; go test's own vet pass would compute its
# analyzers' facts over every dependency again (about a minute of a cold
# make test, for nothing vet has not checked).
# -tags tollgate_testclock: a test may set the time its process's stores
# read (internal/testclock), as the Kong tests' plugin servers are built;
# the one test of a production build's clock runs without the tag after.
# The adaptive tests in a real Caddy (caddymodule's TestCaddyAdaptive*)
# judge latency as the gateway sees it on this machine, so they run in a
# go test of their own once every other package is done: beside the other
# packages' race-detecting tests, a machine's load alone cut a controller
# low and kept it under its margin (CI, once).
UNIT_ENV := TOLLGATE_REDIS_ACL=1 TOLLGATE_CADDY=$(CURDIR)/bin/caddy-race TOLLGATE_REQUIRE_CADDY=1
UNIT_TEST := $(GO) test -race -vet=off -count=1 -json -tags tollgate_testclock
ADAPTIVE_IN_CADDY := ^TestCaddyAdaptive
unit: deps bin/caddy-race
	@{ $(UNIT_ENV) $(UNIT_TEST) -skip '$(ADAPTIVE_IN_CADDY)' ./caddymodule/ ./kongplugin/ ./internal/crossgateway/ $(PKGS) 2>&1; echo "go test exit $$?"; \
	  $(UNIT_ENV) $(UNIT_TEST) -run '$(ADAPTIVE_IN_CADDY)' ./caddymodule/ 2>&1; echo "go test exit $$?"; \
	  $(GO) test -race -vet=off -count=1 -json -run '^TestClockEnvIgnoredInProductionBuilds$$' ./core/openstore/ 2>&1; echo "go test exit $$?"; } | $(GO) run ./internal/testsummary

# The conformance suite must fail: each planted bug in
# core/store/storetest/mutants is caught by its whole traces and by its
# random traces alone.
mutants: deps
	bash core/store/storetest/mutants/run.sh

# The Redis store's tests start real redis-server processes on loopback,
# and the Kong cluster policy's (kongplugin/internal/kongdb) a PostgreSQL
# server of their own.
deps:
	@missing=""; command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	[ -z "$$missing" ] || { \
	  echo "missing:$$missing: installing with apt-get"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; } || { \
	    echo "make test needs redis-server and postgresql: apt-get install -y$$missing"; exit 1; }; }

# The fault and hostile-input tests in their long form (make test runs them
# short): Redis killed and paused for 5 s under load through a real Caddy,
# 10 million rotating keys, a Cluster master killed, plugin server restarts.
chaos: deps bin/caddy
	bash -o pipefail -c "TOLLGATE_CHAOS=long TOLLGATE_CADDY=$(CURDIR)/bin/caddy TOLLGATE_REQUIRE_CADDY=1 $(GO) test -tags tollgate_testclock -count=1 -v \
	  -run 'Outage|Hostile|TopDeniedKeys|NetworkFaults|Partition|ThousandReloads|ThousandInstanceRestarts|ShapingFlood|ClusterMasterFailover|StoppedAndPaused|KongRedisSharedAndFaults|ClientIPTrustedProxies|RefusedConfigs|ReloadKeepsCounters|StoreFailureLogsOnce|InFlightFleet' \
	  ./caddymodule/ ./core/... ./kongplugin/ ./internal/crossgateway/ | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|_test.go:'"

# The alerting rules and the dashboard in examples/prometheus: promtool
# checks the rules and runs their unit tests, then a real Prometheus
# (Debian's package, installed when missing) scrapes a real Caddy with
# tollgate under load until every dashboard query returns data.
monitoring: deps bin/caddy
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "prometheus missing: installing it with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }
	promtool check rules examples/prometheus/tollgate-rules.yml
	cd examples/prometheus && promtool test rules tollgate-rules.test.yml
	$(GO) vet -tags monitoring ./examples/prometheus/
	TOLLGATE_CADDY=$(CURDIR)/bin/caddy TOLLGATE_REQUIRE_CADDY=1 $(GO) test -tags monitoring -count=1 -v -run Dashboard ./examples/prometheus/

# docs/algorithms.svg: one bursty trace through every algorithm;
# docs/adaptive.svg: the adaptive benchmark's traces, both controllers.
plots:
	$(GO) run ./examples/plots -o docs/algorithms.svg
	cd bench && $(GO) run ./adaptive -seeds 1 -svg ../docs/adaptive.svg > /dev/null

# The adaptive benchmark: both controllers against model upstreams of known
# capacity, on a virtual clock (tollgate's own policy and controller code),
# five seeds each; prints the table and its `vs aimd` lines. adaptive-short
# (in make test) asserts the targets over three seeds, built with -race as
# everything else make test builds, so the two share the build cache.
adaptive:
	cd bench && $(GO) run ./adaptive

adaptive-short:
	cd bench && $(GO) test -race -vet=off -count=1 ./adaptive

# The adaptive fleets (two and three Caddies on one redis-server, race
# builds as make test runs them) RUNS times, each run's figures, and per
# fleet size the median and worst: enough runs to tell a change to the
# controller from the tests' own spread. make test runs each fleet once.
RUNS ?= 10
adaptive-fleet: deps bin/caddy-race
	bash -o pipefail -c "TOLLGATE_CADDY=$(CURDIR)/bin/caddy-race TOLLGATE_REQUIRE_CADDY=1 $(GO) test -race -count=$(RUNS) -v \
	  -run 'TestCaddyAdaptiveFleet' ./caddymodule/ | $(GO) run ./internal/fleetspread"

# Every fuzz target for FUZZTIME each (go test fuzzes one target per call):
# the decoders of outside input (Kong configs and the keys command's
# plugin file, the Caddyfile directive, Caddy JSON and key templates, the
# operators' API, Redis replies) and core's step, rate and header code.
# make test runs every seed corpus as a unit test, but no fuzzing: an
# instrumented build of the standard library, go-pdk and Caddy would cost it
# about 1, 1 and 4 minutes cold for a few seconds of fuzzing each.
# fuzz-short is core's targets alone.
FUZZ_TARGETS := ./kongplugin:FuzzKongConfig ./kongplugin:FuzzKeysPluginFile \
	./caddymodule:FuzzCaddyfile ./caddymodule:FuzzCaddyJSON ./caddymodule:FuzzKeyTemplate ./caddymodule:FuzzClientAddressKey \
	./core/admin:FuzzAdminAPI ./core/store/redis/replybound:FuzzReplyBounds
CORE_FUZZ_TARGETS := ./core/algo:FuzzStep ./core/algo:FuzzParseRate ./core/headers:FuzzHeaders

fuzz: deps fuzz-short
	@for t in $(FUZZ_TARGETS); do \
	  echo "fuzz $$t for $(FUZZTIME)"; \
	  $(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t##*:}$$" -fuzztime $(FUZZTIME) || exit 1; done

fuzz-short:
	@for t in $(CORE_FUZZ_TARGETS); do \
	  echo "fuzz $$t for $(FUZZTIME)"; \
	  $(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t##*:}$$" -fuzztime $(FUZZTIME) || exit 1; done

# Peers are measured in the same run, in the bench/ module.
bench: bench-core deps adaptive
	cd bench && $(GO) run ./compare
	cd bench && $(GO) run ./rediscompare
	cd bench && $(GO) run ./scriptcost
	$(MAKE) bench-kong
	$(MAKE) bench-caddy

# wrk against Caddy with tollgate and with mholt/caddy-ratelimit v0.1.0, both
# built into one Caddy so the same binary serves every contender; then the
# same handlers in process (bench/caddyinprocess), where what each adds to
# a request is resolved.
bench-caddy: bin/caddy-bench
	@command -v wrk >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }
	cd bench && $(GO) run ./caddycompare
	cd bench && $(GO) run ./caddyinprocess

bin/caddy-bench: $(CADDY_SRC)
	@mkdir -p bin
	$(GO) tool xcaddy build $(CADDY_VERSION) --output $@ --with github.com/tollgate/tollgate@v0.0.0=$(CURDIR) \
	  --with github.com/mholt/caddy-ratelimit@v0.1.0

# Real Kong (installed as make kong-test does): no plugin, Kong's
# rate-limiting and tollgate, allowed and denied, in rotating rounds of wrk;
# req/s, p50, p99 and CPU per request of Kong's workers, the plugin servers
# and Redis, and the `vs kong-rate-limiting` lines (bench/kongcompare).
bench-kong: kong
	@command -v wrk >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }
	cd bench && PATH=$(KONG_PATH) $(GO) run ./kongcompare

# One access event over the plugin server's socket, as Kong sends it; how
# soon after it starts a plugin server's socket accepts.
bench-kong-socket: deps
	$(GO) test -run '^$$' -bench 'AccessOverSocket|VsFloor|StartToSocket' -benchtime 3s ./kongplugin/

# The memory store's benchmarks, the Caddy handler and the net/http
# middleware in process, each beside a handler that only sets the same
# five headers (their `vs header-floor` lines), the headers alone beside
# those five `Header().Set`s (`vs header-floor headers-write`), a streamed answer's first
# byte through Caddy charging its tokens beside Caddy without tollgate
# (`vs caddy-without-tollgate`), reading a model's answer's usage as
# it streams beside encoding/json (`vs encoding-json`), eventual mode's
# sync, and the Redis store's batched decisions (the client's CPU and
# allocations per decision).
bench-core:
	$(GO) test -run '^$$' -bench . -benchmem ./core/store/memory/
	$(GO) test -run '^$$' -bench 'VsFloor|VsPlainCaddyFirstByte' ./caddymodule/
	$(GO) test -run '^$$' -bench VsFloor ./core/httplimit/
	$(GO) test -run '^$$' -bench WriteVsFloor ./core/headers/
	$(GO) test -run '^$$' -bench ObserveVsClientGolang ./core/metrics/
	$(GO) test -run '^$$' -bench VsEncodingJSON ./core/usage/
	$(GO) test -run '^$$' -bench EventualSync -benchtime 200x ./core/store/redis/
	$(GO) test -run '^$$' -bench DecideBatched -benchtime 3s ./core/store/redis/

clean:
	rm -rf bin .tmp
