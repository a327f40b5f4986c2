#!/usr/bin/env bash
# The one install step the image and a host share: every Python dependency, pinned by requirements.lock.
#   scripts/install-deps.sh [PYTHON]      (default: python3; the host's `make setup` passes the venv's)
# DS_BUILD_CPU_ADAM=1 compiles DeepSpeed's CPU Adam into the package now (the image does this, with
# nvcc present), so the offload configs never compile on a user's first run.
set -euo pipefail
python=${1:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
# torch first: DeepSpeed's build imports it to compile its ops.
"$python" -m pip install --no-cache-dir "$(grep '^torch==' "$here/requirements.lock")"
grep -v -e '^torch==' -e '^deepspeed==' "$here/requirements.lock" > /tmp/requirements.rest
"$python" -m pip install --no-cache-dir -r /tmp/requirements.rest
DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM="${DS_BUILD_CPU_ADAM:-0}" \
  "$python" -m pip install --no-cache-dir --no-build-isolation --no-deps "$(grep '^deepspeed==' "$here/requirements.lock")"
rm -f /tmp/requirements.rest
