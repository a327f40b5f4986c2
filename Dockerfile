# The job image: full fine-tuning with TRL's SFTTrainer on DeepSpeed ZeRO, configured by SFT_* variables.
#   docker run --gpus all --ipc=host -e SFT_MODEL=Qwen/Qwen3-8B -v /data:/data IMAGE
#   make image          the image users run (the CUDA devel base below)
#   make test-image     the CI variant, built and run on a CPU machine (scripts/test-image.sh)
# Build with BuildKit (docker buildx, or DOCKER_BUILDKIT=1): RUN --mount needs it.
#
# Build arguments; only BASE_IMAGE and TORCH_WHEELS differ between the user's image and CI's CPU variant:
#   CUDA_LINE           13.0 (default) or 12.6: the CUDA of torch's build and of the devel base, one argument
#                       for both. 13.0 is PyPI's torch 2.13.0 (cu130) and needs an NVIDIA driver >= 580; 12.6
#                       is torch's own index (download.pytorch.org/whl/cu126), the one CUDA 12 build torch 2.13
#                       ships, for drivers 525 to 579 (docs/host.md). DeepSpeed's op builder wants nvcc of
#                       torch's CUDA major, hence a devel base per line.
#   BASE_IMAGE          the base; default: the CUDA devel base of CUDA_LINE (nvcc for DeepSpeed's JIT ops on
#                       GPUs), each pinned by its multi-arch index digest. CI: local/debian:bookworm (no registry
#                       reachable there).
#   TORCH_WHEELS        pypi: torch as requirements.lock pins it (the CUDA build of CUDA_LINE, several GB);
#                       local: a torch wheel from .cache/wheels/ in the build context (CI: the CPU build).
#   DS_BUILD_CPU_ADAM   1: compile DeepSpeed's CPU Adam now, so the offload stages never compile at run
#                       time.
#   CPU_OPS_MARCH       the x86-64 level DeepSpeed's CPU ops are compiled for, instead of DeepSpeed's
#                       -march=native (the build machine's CPU, which a user's host may lack: an AVX-512 build
#                       dies with SIGILL on a host without it). x86-64-v3 (AVX2, FMA): every x86 host the
#                       clouds rent GPUs with has it (Intel since Haswell, AMD since Zen 1), and CPU Adam runs
#                       at memory bandwidth, so AVX-512's wider vectors buy it little. Empty: -march=native.
#   VERSION, SOURCE_URL the OCI labels; `make image` passes git's description and origin.
#   APP_UID             uid of the non-root user the job runs as (1000: a typical host user's, so files
#                       on the mounted folder belong to them).
# A PyPI behind an intercepting proxy needs its CA bundle: `--secret id=pipcert,src=BUNDLE`. It is mounted
# for the one RUN that installs, never written to a layer.

ARG CUDA_LINE=13.0
ARG BASE_IMAGE=cuda-${CUDA_LINE}
ARG TORCH_WHEELS=pypi

# The CUDA devel base of each line; only the one BASE_IMAGE names is pulled.
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04@sha256:1e8ac7a54c184a1af8ef2167f28fa98281892a835c981ebcddb1fad04bdd452d AS cuda-13.0
FROM nvidia/cuda:12.6.3-devel-ubuntu24.04@sha256:392c0df7b577ecae17a17f6ba7f2009c217bb4422f8431c053ae9af61a8c148a AS cuda-12.6

# The torch wheels the install may use instead of PyPI's: none, or the context's .cache/wheels/.
# Only the stage named by TORCH_WHEELS is built, so .cache/wheels/ need not exist for `pypi`.
FROM scratch AS torch-wheels-pypi
FROM scratch AS torch-wheels-local
COPY .cache/wheels/ /
# DL3006: a stage of this file, chosen by TORCH_WHEELS, not an image to tag.
# hadolint ignore=DL3006
FROM torch-wheels-${TORCH_WHEELS} AS torch-wheels

# DL3006: a stage of this file (cuda-13.0, cuda-12.6) or the image BASE_IMAGE names, pinned there.
# hadolint ignore=DL3006
FROM ${BASE_IMAGE}
ARG CUDA_LINE
ARG DS_BUILD_CPU_ADAM=1
ARG CPU_OPS_MARCH=x86-64-v3
ARG APP_UID=1000

# Python from the base's own packages (Ubuntu 24.04: 3.12; Debian 12: 3.11), g++ and its headers for
# DeepSpeed's ops, tini as PID 1. Ubuntu's images own uid 1000 (user "ubuntu"): hand it to ours.
# DL3008: one list serves Ubuntu (the CUDA base) and Debian (CI), whose versions differ; the base is pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev g++ tini ca-certificates \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
 && useradd --create-home --uid "${APP_UID}" --user-group --shell /bin/bash sft \
 && mkdir -p /data \
 && chown sft:sft /data

# Dependencies before the code, so a code change rebuilds only the small layers below.
COPY requirements.in requirements.lock /app/
COPY scripts/install-deps.sh /app/scripts/install-deps.sh
# pip's cache lives in a BuildKit cache mount (kept between builds on one machine, never in the image).
# The check loads CPU Adam as the job will, under the accelerator it was built for, and fails the build
# if it came from anywhere but the installed package (a JIT compile would land in ~/.cache instead).
RUN --mount=type=secret,id=pipcert \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,from=torch-wheels,target=/wheels \
    if [ -s /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
 && PIP_CACHE_DIR=/root/.cache/pip PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DS_BUILD_CPU_ADAM="${DS_BUILD_CPU_ADAM}" CPU_OPS_MARCH="${CPU_OPS_MARCH}" TORCH_CUDA_LINE="${CUDA_LINE}" \
    /app/scripts/install-deps.sh /opt/venv/bin/python \
 && if [ "${DS_BUILD_CPU_ADAM}" = 1 ]; then \
      DS_ACCELERATOR="$(/opt/venv/bin/python -c 'import torch; print("cuda" if torch.version.cuda else "cpu")')" \
      /opt/venv/bin/python -c "import os, deepspeed, deepspeed.git_version_info as v; from deepspeed.ops.op_builder import CPUAdamBuilder; assert v.installed_ops['cpu_adam'], 'CPU Adam is not in the package'; m = CPUAdamBuilder().load(); assert m.__file__.startswith(os.path.dirname(deepspeed.__file__)), m.__file__; print('CPU Adam prebuilt for', v.accelerator_name, 'at', m.__file__)"; \
    fi \
 && rm -rf /root/.cache/torch_extensions /tmp/*

COPY entrypoint.py /app/entrypoint.py
COPY sft /app/sft
COPY ds_configs /app/ds_configs
COPY demo /app/demo
# Readable by the job's user whatever the modes in the build context; bytecode compiled now, since the
# user cannot write under /app.
RUN chmod -R a+rX /app \
 && /opt/venv/bin/python -m compileall -q /app/entrypoint.py /app/sft

# Last, so that a new version (each commit) rebuilds no layer above.
ARG VERSION=dev
ARG SOURCE_URL=unknown
# What `entrypoint.py --version` prints (sft/version.py reads it).
RUN echo "${VERSION}" > /app/VERSION
LABEL org.opencontainers.image.title="sft-zero" \
      org.opencontainers.image.description="Full fine-tuning of causal LMs with TRL's SFTTrainer on DeepSpeed ZeRO, configured by SFT_* environment variables" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE_URL}"

# Output and the Hugging Face cache under the one folder the user mounts.
ENV PATH=/opt/venv/bin:$PATH \
    SFT_OUTPUT_DIR=/data/output \
    HF_HOME=/data/hf-home \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER ${APP_UID}:${APP_UID}
WORKDIR /data
# tini reaps zombies and forwards SIGTERM to the job's controller only (no -g): the controller tells the
# ranks to save a checkpoint and stop, and must not have them killed under it. Give `docker stop` a
# timeout above SFT_STOP_GRACE_SECONDS (docker's default of 10 s kills the save).
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/venv/bin/python", "/app/entrypoint.py"]
