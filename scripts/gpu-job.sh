#!/usr/bin/env bash
# The job's own entrypoint on a GPU machine, on a Qwen3-shaped model with random weights and
# synthetic chat data (scripts/make_synthetic.py), for each ZeRO stage given. Figures go to $OUT.
#   scripts/gpu-job.sh SHAPE STAGE [STAGE ...]      e.g. scripts/gpu-job.sh qwen3-1.7b 2 3
# Extra SFT_* variables in the environment pass through (SFT_PROBE_STEPS, SFT_MAX_STEPS, ...).
set -uo pipefail
shape=$1; shift
out=${OUT:-/tmp/gpu-job}
work=${WORK:-/tmp/gpu-work}
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
[ -d "$work/$shape" ] || python3 scripts/make_synthetic.py --shape "$shape" --out "$work" --conversations "${CONVERSATIONS:-1000}"
for stage in "$@"; do
  rm -rf "$work/out-$stage"
  start=$(date +%s)
  SFT_MODEL="$work/$shape" SFT_DATASET="$work/chat.jsonl" SFT_ZERO_STAGE="$stage" SFT_OUTPUT_DIR="$work/out-$stage" \
    HF_HUB_OFFLINE=1 HF_HOME="$work/hf-home" python3 entrypoint.py > "$out/job-$stage.log" 2>&1
  code=$?
  echo "ZeRO $stage: exit $code in $(( $(date +%s) - start )) s"
  cp "$work/out-$stage/run/probe.json" "$out/probe-$stage.json" 2>/dev/null
  python3 - "$work/out-$stage/run/summary.json" "$out/summary-$stage.json" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except FileNotFoundError:
    sys.exit(print("no summary"))
s.get("train", {}).pop("log_history", None)
json.dump(s, open(sys.argv[2], "w"), indent=1)
print(json.dumps({"probe": s.get("probe"), "train": s.get("train"), "status": s.get("status")}, indent=1))
PY
  tail -5 "$out/job-$stage.log"
  rm -rf "$work/out-$stage"/checkpoint-*  # the device's disk holds one 2B model's DeepSpeed state at a time
done
