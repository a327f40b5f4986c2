#!/usr/bin/env bash
# The build arguments of the image users run, one KEY=VALUE a line, for one CUDA line: `make image` passes each as
# --build-arg, the release workflow (.github/workflows/release.yml) as docker/build-push-action's build-args, so
# what a release pushes is what `make image` builds.
#   scripts/image-args.sh CUDA_LINE        13.0 (drivers >= 580) or 12.6 (drivers >= 525): docs/host.md
# VERSION and SOURCE_URL (the OCI labels, /app/VERSION) from the environment, else git's description and origin.
set -euo pipefail
line=${1:?usage: scripts/image-args.sh CUDA_LINE (13.0 or 12.6)}
case "$line" in
  13.0 | 12.6) ;;
  *) echo "image-args.sh: CUDA line '$line': expected 13.0 or 12.6" >&2; exit 2 ;;
esac
echo "CUDA_LINE=$line"
echo "VERSION=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}"
echo "SOURCE_URL=${SOURCE_URL:-$(git remote get-url origin 2>/dev/null || echo unknown)}"
