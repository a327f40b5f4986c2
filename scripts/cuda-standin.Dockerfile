# A stand-in for nvidia/cuda:13.0.0-devel-ubuntu24.04 (the base of the image users run) for machines that
# reach PyPI but no registry that has NVIDIA's image (no Docker Hub): the toolkit of CUDA 13.0.0 from
# NVIDIA's own wheels (the cuda-toolkit metapackage, whose extras pin each part's 13.0.0 release), laid out
# as the devel image lays it out (/usr/local/cuda -> cuda-13.0 with bin/nvcc, include, lib64, nvvm), on
# the Debian base that scripts/docker-engine.sh makes. scripts/image-cuda-standin.sh builds it, then the
# real Dockerfile on it (`make image-cuda-standin`).
# What it leaves out of the real base: Ubuntu 24.04 (this is Debian 12: Python 3.11, not 3.12), and the
# toolkit parts nothing here compiles against (NCCL, cuDNN, cuFFT, NPP, Nsight, the libcuda stub). It
# has what nvcc needs (nvcc, nvvm's cicc, crt, cudart, CCCL) and what torch's CUDA extensions include
# (ATen/cuda/CUDAContext.h: cuBLAS, cuSPARSE, cuSOLVER; NVRTC, NVTX; DeepSpeed's ops: cuRAND).
ARG BASE_IMAGE=local/debian:bookworm

FROM ${BASE_IMAGE} AS toolkit
# DL3008: the base is pinned (a debootstrap of one Debian release); pip is only a tool of this stage.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv ca-certificates \
 && python3 -m venv /opt/pip
# The wheels put every part under site-packages/nvidia/cu13/: that tree becomes /usr/local/cuda-13.0.
# The libraries come as libX.so.N only; the linker's -lX needs libX.so, as the devel packages ship it.
# nvcc runs cicc from nvvm/bin (nvcc.profile's CICC_PATH), where the toolkit has it; the 13.0.0 wheel puts
# it in bin/.
RUN --mount=type=secret,id=pipcert \
    if [ -s /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
 && /opt/pip/bin/pip install --no-cache-dir --disable-pip-version-check \
      "cuda-toolkit[nvcc,nvvm,crt,cudart,cccl,nvrtc,cublas,curand,cusparse,cusolver,nvtx]==13.0.0" \
 && cuda=/usr/local/cuda-13.0 \
 && mv /opt/pip/lib/python3*/site-packages/nvidia/cu13 "$cuda" \
 && rm -rf "$cuda/.metadata" \
 && ln -s lib "$cuda/lib64" \
 && mkdir -p "$cuda/nvvm/bin" \
 && if [ -e "$cuda/bin/cicc" ]; then mv "$cuda/bin/cicc" "$cuda/nvvm/bin/"; fi \
 && for f in "$cuda"/lib/lib*.so.*; do link="${f%%.so.*}.so"; [ -e "$link" ] || ln -s "${f##*/}" "$link"; done

FROM ${BASE_IMAGE}
COPY --from=toolkit /usr/local/cuda-13.0 /usr/local/cuda-13.0
# As NVIDIA's image: the version's folder behind /usr/local/cuda, its libraries known to the loader.
RUN ln -s cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda-13.0/lib > /etc/ld.so.conf.d/988_cuda-13.conf \
 && ldconfig
# NVIDIA's image's environment: nvcc on PATH (torch's cpp_extension finds CUDA_HOME from it), and what the
# NVIDIA container runtime reads to mount the driver's libraries.
ENV CUDA_VERSION=13.0.0 \
    PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
CMD ["/bin/bash"]
