#!/usr/bin/env bash
# make docker-test: the example fleets (examples/caddy, examples/kong) in a
# real Docker engine, with every image built on this machine (no registry
# is reachable here). It installs what is missing (Debian's docker.io and
# busybox-static, and Docker Compose v2 from the Go module proxy), starts
# dockerd when none runs and stops only a dockerd it started, then runs
# the fleet tests (build tag dockertest), after kongimage.sh has built a
# Kong 3.9.3 image from ../shared/kong-real's tree.
set -euo pipefail
cd "$(dirname "$0")/../.."

COMPOSE_VERSION=v2.28.1 # Compose v2 is a Go program; Debian ships only v1 (Python)
GO=${GO:-go}

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
need=()
command -v dockerd >/dev/null || need+=(docker.io)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static) # wget for the images' healthchecks
if ((${#need[@]})); then
  echo "docker-test: installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

started=""
log="$(mktemp -t tollgate-dockerd.XXXXXX.log)"
stop_dockerd() {
  if [ -n "$started" ]; then
    echo "docker-test: stopping the dockerd it started (pid $started)"
    $sudo kill "$started" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$started" 2>/dev/null || break; sleep 0.1; done
  fi
}
# dockerd's log stays for a failed run to read, and goes with a passed one.
trap 'rc=$?; stop_dockerd; [ "$rc" != 0 ] || rm -f "$log"' EXIT
if ! docker info >/dev/null 2>&1; then
  echo "docker-test: starting dockerd (log: $log)"
  $sudo dockerd >"$log" 2>&1 &
  started=$!
  for _ in $(seq 600); do
    docker info >/dev/null 2>&1 && break
    if ! kill -0 "$started" 2>/dev/null; then
      echo "docker-test: dockerd exited:"; cat "$log"; exit 1
    fi
    sleep 0.1
  done
  docker info >/dev/null 2>&1 || { echo "docker-test: dockerd did not answer within 60 s:"; cat "$log"; exit 1; }
fi

# Docker Compose v2 as the CLI plugin `docker compose`, where the docker CLI
# looks for plugins of this user.
plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
if ! docker compose version >/dev/null 2>&1; then
  echo "docker-test: building Docker Compose $COMPOSE_VERSION (github.com/docker/compose/v2, from the Go module proxy)"
  tmp="$(mktemp -d)"
  GOBIN="$tmp" CGO_ENABLED=0 $GO install "github.com/docker/compose/v2/cmd@$COMPOSE_VERSION"
  mkdir -p "$plugins"
  mv "$tmp/cmd" "$plugins/docker-compose"
  rm -rf "$tmp"
fi
docker compose version

# Kong 3.9.3 as an image (no registry serves kong:3.9 here).
bash internal/dockerfleet/kongimage.sh

$GO test -tags dockertest -count=1 -timeout 30m -v ./internal/dockerfleet/ 2>&1 \
  | grep -E '^(=== RUN|--- |\s+--- |ok|FAIL|PASS|panic)|_test.go:'
exit "${PIPESTATUS[0]}"
