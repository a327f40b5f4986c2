#!/usr/bin/env bash
# The one install step the image and a host share: every Python dependency, pinned by requirements.lock.
#   scripts/install-deps.sh [PYTHON]      (default: python3; the host's `make setup` passes the venv's)
# Read from the environment:
#   DS_BUILD_CPU_ADAM=1  compile DeepSpeed's CPU Adam into the package now (the image does this), so the
#                        offload configs never compile on a user's first run
#   PIP_FIND_LINKS       a folder with a torch wheel of another build, preferred over PyPI's (the image's
#                        CI variant puts the CPU build there)
#   PIP_CACHE_DIR        set: pip keeps its cache there (the image build's cache mount); unset: no cache
#   DS_ACCELERATOR       cuda or cpu: the accelerator DeepSpeed's ops are built for (default: torch's build)
set -euo pipefail
python=${1:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
lock="$here/requirements.lock"
cache=(--no-cache-dir)
if [ -n "${PIP_CACHE_DIR:-}" ]; then cache=(); fi
pin() { grep "^$1==" "$lock"; }
# FlashAttention-4 (SFT_ATTENTION=flash_attention_4): GPU kernels, useless with a CPU build of torch. Their names
# are requirements.in's last section, read here as `make lock` reads it: one list.
mapfile -t GPU_ONLY < <(sed -n '/^# SFT_ATTENTION=flash_attention_4/,$p' "$here/requirements.in" | grep -v '^#' |
                        sed 's/==.*//')
[ ${#GPU_ONLY[@]} -gt 0 ] || { echo "install-deps.sh: no GPU-only section in $here/requirements.in" >&2; exit 1; }

# The tools that build DeepSpeed from its sdist, pinned: a new setuptools can break an old setup.py.
"$python" -m pip install "${cache[@]}" --upgrade pip==26.3 setuptools==84.2.1 wheel==0.48.0
# torch first: DeepSpeed's build imports it to compile its ops. Its own dependencies as the lock pins them.
"$python" -m pip install "${cache[@]}" -c "$lock" "$(pin torch)"
rest=$(mktemp)
grep -v -e '^torch==' -e '^deepspeed==' -e '^liger-kernel==' $(printf -- '-e ^%s== ' "${GPU_ONLY[@]}") "$lock" \
  > "$rest"
"$python" -m pip install "${cache[@]}" -r "$rest"
rm -f "$rest"
# Liger's kernels need Triton, which CUDA builds of torch bring and CPU builds do not: no dependencies of
# its own, so a CPU host gets no Triton it cannot use (SFT_LIGER_KERNELS=auto then leaves them off).
"$python" -m pip install "${cache[@]}" --no-deps "$(pin liger-kernel)"
# DeepSpeed records the accelerator its ops were built for and loads a prebuilt op only under the same
# one. A build with no GPU (docker build) would detect and record "cpu": follow torch's build instead.
accelerator=${DS_ACCELERATOR:-$("$python" -c 'import torch; print("cuda" if torch.version.cuda else "cpu")')}
# With a CUDA torch, which brings the cuda-bindings they need: no dependencies of their own beyond the lock's.
if [ "$accelerator" = cuda ]; then
  "$python" -m pip install "${cache[@]}" --no-deps $(for name in "${GPU_ONLY[@]}"; do pin "$name"; done)
fi
# On the CPU accelerator every start of the ranks also loads the shared-memory comm op (about 45 s to
# compile on 2 cores, into a cache a container loses): prebuild it together with CPU Adam.
shm_comm=0
if [ "$accelerator" = cpu ] && [ "${DS_BUILD_CPU_ADAM:-0}" = 1 ]; then shm_comm=1; fi
# Never from pip's cache: a cached DeepSpeed wheel would ignore DS_BUILD_CPU_ADAM and the torch it was built on.
DS_ACCELERATOR=$accelerator DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM="${DS_BUILD_CPU_ADAM:-0}" DS_BUILD_SHM_COMM=$shm_comm \
  "$python" -m pip install --no-cache-dir --no-build-isolation --no-deps "$(pin deepspeed)"
