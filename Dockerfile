# The job image: full fine-tuning with TRL's SFTTrainer on DeepSpeed ZeRO, configured by SFT_* variables.
#   docker run --gpus all --ipc=host -e SFT_MODEL=Qwen/Qwen3-8B -v /data:/data IMAGE
#   make image          the image users run (the CUDA devel base below)
#   make test-image     the CI variant, built and run on a CPU machine (scripts/test-image.sh)
# Build with BuildKit (docker buildx, or DOCKER_BUILDKIT=1): RUN --mount needs it.
#
# Build arguments; only the first two differ between the user's image and CI's CPU variant:
#   BASE_IMAGE          CUDA devel base (nvcc for DeepSpeed's JIT ops on GPUs). CUDA 13.0 matches PyPI's
#                       torch 2.13.0 (cu130), as DeepSpeed's op builder requires. Its multi-arch index is
#                       pinned by digest. CI: local/debian:bookworm (no registry reachable there).
#   TORCH_WHEELS        pypi: torch as requirements.lock pins it, from PyPI (the CUDA build, several GB);
#                       local: a torch wheel from .cache/wheels/ in the build context (CI: the CPU build).
#   DS_BUILD_CPU_ADAM   1: compile DeepSpeed's CPU Adam now, so the offload stages never compile at run
#                       time. It is compiled for the build machine's CPU (DeepSpeed uses -march=native):
#                       build on the CPU family the GPU hosts have, or set 0 to compile on first use.
#   VERSION, SOURCE_URL the OCI labels; `make image` passes git's description and origin.
#   APP_UID             uid of the non-root user the job runs as (1000: a typical host user's, so files
#                       on the mounted folder belong to them).
# A PyPI behind an intercepting proxy needs its CA bundle: `--secret id=pipcert,src=BUNDLE`. It is mounted
# for the one RUN that installs, never written to a layer.

ARG BASE_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04@sha256:1e8ac7a54c184a1af8ef2167f28fa98281892a835c981ebcddb1fad04bdd452d
ARG TORCH_WHEELS=pypi

# The torch wheels the install may use instead of PyPI's: none, or the context's .cache/wheels/.
# Only the stage named by TORCH_WHEELS is built, so .cache/wheels/ need not exist for `pypi`.
FROM scratch AS torch-wheels-pypi
FROM scratch AS torch-wheels-local
COPY .cache/wheels/ /
# DL3006: a stage of this file, chosen by TORCH_WHEELS, not an image to tag.
# hadolint ignore=DL3006
FROM torch-wheels-${TORCH_WHEELS} AS torch-wheels

FROM ${BASE_IMAGE}
ARG DS_BUILD_CPU_ADAM=1
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
    DS_BUILD_CPU_ADAM="${DS_BUILD_CPU_ADAM}" /app/scripts/install-deps.sh /opt/venv/bin/python \
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
