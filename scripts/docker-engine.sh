#!/usr/bin/env bash
# A Docker engine for CI on a bare Debian machine, and the local base image the CI variant builds on.
#   DOCKER=$(scripts/docker-engine.sh)      prints the docker command to use; everything else goes to stderr
# Idempotent and cached: each step is skipped when its result is already there.
#   1. docker.io (Debian's engine) and debootstrap, from apt, if dockerd is missing
#   2. dockerd in the background, if no engine answers
#   3. local/debian:bookworm (debootstrap minbase, imported), if missing; the root file system is kept as a
#      tarball under $IMAGE_CACHE_DIR, so a restarted engine re-imports it in seconds instead of ~40 s
# No registry is reachable from these machines (no Docker Hub), hence a base built from Debian's own packages.
set -euo pipefail

BASE_TAG=${BASE_TAG:-local/debian:bookworm}
# where the base image's tarball is kept between runs on this machine
IMAGE_CACHE_DIR=${IMAGE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sft-zero-image}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/dockerd.log}

log() { echo "docker-engine: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  log "installing docker.io and debootstrap from apt"
  as_root apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    docker.io debootstrap >&2
fi

# The CLI must build with BuildKit (build secrets, cache mounts). A newer CLI without the buildx plugin
# refuses DOCKER_BUILDKIT=1, while Debian's 20.10 CLI (/usr/bin/docker) carries BuildKit itself.
docker_cli() {
  if docker buildx version >/dev/null 2>&1; then
    command -v docker
  elif [ -x /usr/bin/docker ]; then
    echo /usr/bin/docker
  else
    command -v docker
  fi
}
DOCKER=$(docker_cli)

if ! "$DOCKER" info >/dev/null 2>&1; then
  log "starting dockerd (log: $DOCKERD_LOG)"
  as_root sh -c "nohup dockerd >>'$DOCKERD_LOG' 2>&1 &"
  for _ in $(seq 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  "$DOCKER" info >/dev/null 2>&1 || { log "dockerd did not answer within 60 s; see $DOCKERD_LOG"; tail -20 "$DOCKERD_LOG" >&2; exit 1; }
fi

debian_mirror() {
  # The machine's own Debian mirror (deb822 sources first, then the one-line format).
  local uri
  uri=$(awk '/^URIs:/ && !/security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '/^deb / && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

if ! "$DOCKER" image inspect "$BASE_TAG" >/dev/null 2>&1; then
  tarball="$IMAGE_CACHE_DIR/debian-bookworm-minbase.tar"
  if [ ! -s "$tarball" ]; then
    mirror=$(debian_mirror)
    root=$(mktemp -d /tmp/debootstrap.XXXXXX)
    log "debootstrap bookworm from $mirror (about 40 s)"
    as_root debootstrap --variant=minbase bookworm "$root" "$mirror" >&2
    as_root rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    mkdir -p "$IMAGE_CACHE_DIR"
    as_root tar -C "$root" -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
    as_root rm -rf "$root"
  fi
  log "importing $tarball as $BASE_TAG"
  # An imported root file system has no image config: give it the PATH a Debian image has.
  "$DOCKER" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_TAG" >&2
fi

echo "$DOCKER"
