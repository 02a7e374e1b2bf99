#!/usr/bin/env bash
# Builds tollgate-kong-base:dockertest, a Kong Gateway 3.9.3 image made on
# this machine (no registry serves kong:3.9 here): a Debian bookworm base
# from debootstrap, the Debian packages Kong's tree links to, and the
# prebuilt Kong tree of ../shared/kong-real unpacked in /usr/local, as its
# install.sh does on a host. It behaves as the public kong:3.9 image does
# where examples/kong relies on it: user kong owning /usr/local/kong, the
# `kong` CLI on PATH (so `kong health` works), and an entrypoint that runs
# `kong prepare` and nginx in the foreground for CMD ["kong","docker-start"].
# One difference, in the image's environment: KONG_ROUTER_FLAVOR=traditional,
# because this tree has no atc-router (see ../shared/kong-real/README.md).
#
# The image carries a label with the checksum of its inputs (this script
# and the Kong tree), so a second run reuses it. Needs root (debootstrap).
# Without the tree, where a registry is reachable, the public kong:3.9
# image stands in.
set -euo pipefail
cd "$(dirname "$0")/../.."

image=tollgate-kong-base:dockertest
# KONG_REAL is where the Kong tree is (make passes its own, as for make
# kong-test; CI has it beside the checkout).
tree=${KONG_REAL:-../shared/kong-real}/kong-3.9.3-debian12-amd64.tar.xz
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What ../shared/kong-real/install.sh installs beside the tree, and perl for
# the resty CLI that runs `kong`.
packages=libssl3,libpcre2-8-0,zlib1g,libyaml-0-2,libexpat1,libsnappy1v5,libstdc++6,lua-yaml,lua-sec,lua-lpeg,lua-inspect,lua-socket,lua-penlight,lua-expat,lua-filesystem,lua-messagepack,perl,ca-certificates

if [ ! -f "$tree" ]; then
  # Where a registry is reachable, Kong's public image is the base.
  if docker image inspect kong:3.9 >/dev/null 2>&1 || docker pull -q kong:3.9 >/dev/null 2>&1; then
    docker tag kong:3.9 "$image"
    echo "kongimage: no Kong tree at $tree; $image is the public kong:3.9"
    exit 0
  fi
  echo "kongimage: no Kong tree at $tree (set KONG_REAL) and no kong:3.9 image to pull" >&2
  exit 1
fi
sum="$(cat "$0" "$tree" | sha256sum | cut -c1-16)"
if [ "$(docker image inspect -f '{{index .Config.Labels "tollgate.inputs"}}' "$image" 2>/dev/null)" = "$sum" ]; then
  echo "kongimage: $image is up to date ($sum)"
  exit 0
fi

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
command -v debootstrap >/dev/null || {
  echo "kongimage: installing Debian's debootstrap"
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
}

rootfs="$(mktemp -d -t tollgate-kongroot.XXXXXX)"
trap '$sudo rm -rf "$rootfs"' EXIT
began=$SECONDS
echo "kongimage: debootstrap bookworm (minbase) with Kong's runtime packages from $mirror"
if ! $sudo debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
  tail -20 "$rootfs.log" >&2
  exit 1
fi
rm -f "$rootfs.log"
xz -dc "$tree" | $sudo tar -x -C "$rootfs/usr/local" -f -
$sudo chroot "$rootfs" useradd --system --user-group --home-dir /usr/local/kong --shell /bin/sh kong
$sudo mkdir -p "$rootfs/usr/local/kong"
$sudo chroot "$rootfs" chown -R kong:kong /usr/local/kong
$sudo rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
$sudo tee "$rootfs/docker-entrypoint.sh" >/dev/null <<'EOF'
#!/bin/sh
# kong docker-start: prepare the prefix from KONG_* settings, then nginx in
# the foreground as PID 1 (its master starts the workers and they the
# plugin servers). Any other command runs as given.
set -e
if [ "$1" = kong ] && [ "$2" = docker-start ]; then
  kong prepare -p "$KONG_PREFIX"
  exec nginx -p "$KONG_PREFIX" -c nginx.conf
fi
exec "$@"
EOF
$sudo chmod 755 "$rootfs/docker-entrypoint.sh"

$sudo tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/openresty/bin:/usr/local/openresty/nginx/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV KONG_PREFIX=/usr/local/kong KONG_NGINX_DAEMON=off KONG_ROUTER_FLAVOR=traditional' \
  --change 'USER kong' \
  --change 'WORKDIR /usr/local/kong' \
  --change 'ENTRYPOINT ["/docker-entrypoint.sh"]' \
  --change 'CMD ["kong", "docker-start"]' \
  --change 'EXPOSE 8000 8001' \
  --change "LABEL tollgate.inputs=$sum" \
  - "$image" >/dev/null
echo "kongimage: built $image in $((SECONDS - began)) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%d MB", $1/1e6}'))"
