# Full fine-tuning on DeepSpeed ZeRO in one image. `make help` lists the targets.
.PHONY: help setup demo test docs image image-cuda-standin test-image run probe lock clean

# the interpreter the host venv is made from
PYTHON ?= python3.11
# where `make setup` installs the locked dependencies
VENV ?= .venv
# the image tag `make image` builds and `make run` starts
IMAGE ?= sft-zero:latest
# the CUDA line of `make image`: 13.0 (NVIDIA driver >= 580) or 12.6 (driver >= 525; docs/host.md)
CUDA_LINE ?= 13.0
# override the Dockerfile's pinned CUDA devel base of CUDA_LINE (empty: its default)
BASE_IMAGE ?=
# the docker command; it must build with BuildKit (the buildx plugin, or Debian's docker.io CLI)
DOCKER ?= docker
# further flags for `docker build` (e.g. --network host where a build reaches PyPI only through the host's)
DOCKER_BUILD_FLAGS ?=
# a CA bundle pip needs to reach PyPI (default: pip's own PIP_CERT), handed to the build as a secret
PIP_CERT ?=
# the image's OCI labels
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
SOURCE_URL ?= $(shell git remote get-url origin 2>/dev/null || echo unknown)
# processes the tests run in (pytest-xdist; a test file stays in one, so its shared runs are made once); 0: this one
TEST_WORKERS ?= 2
# the tag of the CI variant `make test-image` builds (CPU torch, Debian base)
CI_IMAGE ?= sft-zero:ci
# host folder mounted at /data by `make run` and `make probe`
DATA ?= $(CURDIR)/data
PY := $(VENV)/bin/python
# `make run` and `make probe`: the README's `docker run` flags. --stop-timeout above SFT_STOP_GRACE_SECONDS (300),
# or docker stop kills the save after 10 s; memlock unlimited for offload's pinned memory; the host's /dev/shm.
STOP_TIMEOUT ?= 600
RUN_FLAGS = --rm --gpus all --ipc=host --ulimit memlock=-1 --stop-timeout $(STOP_TIMEOUT) -v $(DATA):/data \
  $(foreach v,$(filter SFT_% HF_TOKEN WANDB_% MLFLOW_%,$(.VARIABLES)),-e $(v))
comma := ,

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-19s %s\n", $$1, $$2}'

setup:  ## make the venv and install requirements.lock (the same step the image runs)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	scripts/install-deps.sh $(PY)

demo:  ## the whole job on the embedded tiny model and data, on CPU with two ranks
	SFT_MODEL=demo/tiny-qwen3 SFT_DATASET=demo/chat.jsonl SFT_OUTPUT_DIR=output/demo \
	SFT_MAX_LENGTH=128 SFT_MICRO_BATCH=1 SFT_GRAD_ACCUM=1 SFT_PROBE_STEPS=10 SFT_SAVE_STEPS=40 \
	SFT_LEARNING_RATE=2e-3 HF_HUB_OFFLINE=1 $(PY) entrypoint.py

test:  ## the test suite (CPU; GPU tests skip with their reason)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25  # the slowest 25: CI has 90 minutes

docs:  ## write docs/settings.md's table from the settings' help texts, docs/host.md from the planner (tests keep them equal)
	$(PY) scripts/settings_table.py
	$(PY) scripts/host_table.py

# the build arguments the release workflow passes too (scripts/image-args.sh): what a release pushes is what this builds
image:  ## build the image users run (CUDA devel base of CUDA_LINE) and print its size
	args=$$(VERSION=$(VERSION) SOURCE_URL=$(SOURCE_URL) scripts/image-args.sh $(CUDA_LINE)) && \
	DOCKER_BUILDKIT=1 $(DOCKER) build $(DOCKER_BUILD_FLAGS) $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
	  $(if $(PIP_CERT),--secret id=pipcert$(comma)src=$(PIP_CERT)) $$(printf -- '--build-arg %s ' $$args) -t $(IMAGE) .
	@$(DOCKER) images $(IMAGE) --format 'image {{.Repository}}:{{.Tag}}: {{.Size}}'

image-cuda-standin:  ## `make image` on a stand-in CUDA base from NVIDIA's PyPI wheels, checked inside (no GPU; not in CI)
	scripts/image-cuda-standin.sh

test-image:  ## build the CI variant of the image (CPU, Debian base) and check it as a user runs it
	IMAGE=$(CI_IMAGE) scripts/test-image.sh

run:  ## the job in the image, on every GPU, output in $(DATA)
	$(DOCKER) run $(RUN_FLAGS) $(IMAGE)

probe:  ## only the probe, in the image
	$(DOCKER) run $(RUN_FLAGS) $(IMAGE) probe

lock:  ## re-pin requirements.lock from requirements.in (in a fresh venv)
	rm -rf /tmp/lock-venv && $(PYTHON) -m venv /tmp/lock-venv
	sed -n '/^# SFT_ATTENTION=flash_attention_4/,$$p' requirements.in | grep -v '^#' > /tmp/lock-venv/gpu-only.in
	grep -v '^liger-kernel' requirements.in | grep -v -x -F -f /tmp/lock-venv/gpu-only.in \
	  > /tmp/lock-venv/requirements.in
	/tmp/lock-venv/bin/pip install -q -r /tmp/lock-venv/requirements.in
	/tmp/lock-venv/bin/pip install -q --no-deps "$$(grep '^liger-kernel' requirements.in | cut -d' ' -f1)" \
	  -r /tmp/lock-venv/gpu-only.in
	/tmp/lock-venv/bin/pip freeze | sed 's/+cpu$$//' > requirements.lock

clean:  ## remove the demo's output
	rm -rf output
