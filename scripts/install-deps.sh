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
#   TORCH_CUDA_LINE      13.0 or empty: torch as PyPI has it (CUDA 13.0 on Linux); 12.6: torch's CUDA 12.6 build
#                        from download.pytorch.org (the image's line for older drivers)
#   CPU_OPS_MARCH        x86-64-v2, -v3 or -v4: DeepSpeed's CPU ops compiled for that level instead of DeepSpeed's
#                        -march=native (the image: a build machine's CPU is not the user's); empty: native
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
# A CUDA line other than PyPI's is torch's own index, named by its local version (+cu126): exactly that build.
torch=$(pin torch)
torch_index=()
case "${TORCH_CUDA_LINE:-13.0}" in
  13.0) ;;
  12.6) torch="$torch+cu126"; torch_index=(--extra-index-url https://download.pytorch.org/whl/cu126) ;;
  *) echo "install-deps.sh: TORCH_CUDA_LINE=$TORCH_CUDA_LINE: expected 13.0 or 12.6" >&2; exit 1 ;;
esac
"$python" -m pip install "${cache[@]}" "${torch_index[@]}" -c "$lock" "$torch"
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
# With a CUDA 13 torch, which brings the cuda-bindings they need: no dependencies of their own beyond the lock's.
# Not with CUDA 12: the lock's CuTe DSL libraries are CUDA 13's, which a driver below 580 cannot run
# (SFT_ATTENTION=auto then picks another attention).
torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")')
if [ "$accelerator" = cuda ] && [ "${torch_cuda%%.*}" = 13 ]; then
  "$python" -m pip install "${cache[@]}" --no-deps $(for name in "${GPU_ONLY[@]}"; do pin "$name"; done)
fi
# On the CPU accelerator every start of the ranks also loads the shared-memory comm op (about 45 s to
# compile on 2 cores, into a cache a container loses): prebuild it together with CPU Adam.
shm_comm=0
if [ "$accelerator" = cpu ] && [ "${DS_BUILD_CPU_ADAM:-0}" = 1 ]; then shm_comm=1; fi
# DeepSpeed compiles its CPU ops with -march=native and the SIMD width of the build machine's CPU, and offers no
# switch for either: for CPU_OPS_MARCH its source is fetched and OpBuilder's two methods replaced at the end of
# its builder.py (both copies: the one setup.py builds with, the one the package installs for JIT builds).
deepspeed=$(pin deepspeed)
if [ -n "${CPU_OPS_MARCH:-}" ]; then
  case "$CPU_OPS_MARCH" in
    x86-64-v2) simd=-D__SCALAR__ ;;  # SSE4.2 only: DeepSpeed's vector code needs AVX2 or AVX-512
    x86-64-v3) simd=-D__AVX256__ ;;
    x86-64-v4) simd=-D__AVX512__ ;;
    *) echo "install-deps.sh: CPU_OPS_MARCH=$CPU_OPS_MARCH: expected x86-64-v2, x86-64-v3 or x86-64-v4" >&2; exit 1 ;;
  esac
  src=$(mktemp -d)
  DS_ACCELERATOR=$accelerator DS_BUILD_OPS=0 "$python" -m pip download -q --no-cache-dir --no-deps \
    --no-binary deepspeed --no-build-isolation -d "$src" "$deepspeed"
  tar -xzf "$src"/deepspeed-*.tar.gz -C "$src"
  for builder in "$src"/deepspeed-*/op_builder/builder.py "$src"/deepspeed-*/deepspeed/ops/op_builder/builder.py; do
    grep -q '^class OpBuilder' "$builder" && grep -q 'def cpu_arch(self)' "$builder" &&
      grep -q 'def simd_width(self)' "$builder" ||
      { echo "install-deps.sh: $builder has no OpBuilder.cpu_arch/simd_width: review CPU_OPS_MARCH" >&2; exit 1; }
    printf '\n\n# scripts/install-deps.sh (sft-zero), CPU_OPS_MARCH: portable CPU ops, not the build machine'"'"'s\n%s\n%s\n' \
      "OpBuilder.cpu_arch = lambda self: '-march=$CPU_OPS_MARCH'" "OpBuilder.simd_width = lambda self: '$simd'" \
      >> "$builder"
  done
  deepspeed=$(echo "$src"/deepspeed-*/)
fi
# Never from pip's cache: a cached DeepSpeed wheel would ignore DS_BUILD_CPU_ADAM and the torch it was built on.
DS_ACCELERATOR=$accelerator DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM="${DS_BUILD_CPU_ADAM:-0}" DS_BUILD_SHM_COMM=$shm_comm \
  "$python" -m pip install --no-cache-dir --no-build-isolation --no-deps "$deepspeed"
if [ -n "${CPU_OPS_MARCH:-}" ]; then rm -rf "$src"; fi
