#!/usr/bin/env python3
"""The loss of each optimizer state the job may pick, on the same model, data and seed: the whole job
(`entrypoint.py`, no probe) once per SFT_OPTIMIZER value, every step's loss read from rank 0's report, then the gap
to the first value's losses and each run's step time and peak memory.

    python scripts/bench_optimizer_numerics.py --model DIR --data FILE [--steps 300] [--optimizers adamw,adamw-8bit]

The first optimizer is the reference (full precision). The gap is per step (the same rows each step: the same seed,
the same packing); "last 100" means the mean over the last 100 steps (or a third of them, fewer steps). Each run's
output folder is removed after it is read unless --keep (a Qwen3-1.7B checkpoint is 24 GB).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent


def run(optimizer: str, model: str, data: str, steps: int, work: Path, extra: dict[str, str]) -> dict:
    out = work / optimizer
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "SFT_MODEL": model, "SFT_DATASET": data, "SFT_OUTPUT_DIR": str(out),
           "SFT_OPTIMIZER": optimizer, "SFT_MAX_STEPS": str(steps), "SFT_PROBE_STEPS": "0",
           "SFT_LOGGING_STEPS": "1", "SFT_SAVE_STEPS": str(10 * steps), "HF_HUB_OFFLINE": "1",
           **{f"SFT_{k.upper()}": v for k, v in extra.items()}}
    log = work / f"{optimizer}.log"
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, str(REPO / "entrypoint.py")], env=env, stdout=f,
                              stderr=subprocess.STDOUT).returncode
    result: dict = {"optimizer": optimizer, "exit_code": code, "log": str(log)}
    report = out / "run" / "reports" / "train-rank0.json"
    summary = out / "run" / "summary.json"
    if report.exists():
        r = json.loads(report.read_text())
        result["losses"] = [h["loss"] for h in r["log_history"] if "loss" in h]
        ends = [t for _, t, _ in r.get("steps") or []]  # (step, monotonic time at its end, tokens so far)
        seconds = [b - a for a, b in zip(ends, ends[1:])][len(ends) // 5:]  # past the first fifth: warm
        result["median_step_seconds"] = statistics.median(seconds) if seconds else None
        result["peak_reserved_gib"] = round((r.get("peak_reserved_bytes") or 0) / 2**30, 2)
    if summary.exists():
        resolved = json.loads(summary.read_text()).get("resolved") or {}
        result["stage"] = resolved.get("stage")
        result["predicted_peak_gib"] = resolved.get("predicted_peak_gib")
    if not os.environ.get("KEEP_OUTPUT"):
        shutil.rmtree(out, ignore_errors=True)
    return result


@click.command()
@click.option("--model", required=True, help="Model folder (scripts/make_synthetic.py makes one).")
@click.option("--data", required=True, help="Chat data (.jsonl).")
@click.option("--steps", default=300, show_default=True, help="Optimizer steps per run.")
@click.option("--optimizers", default="adamw,adamw-8bit", show_default=True,
              help="SFT_OPTIMIZER values; the first is the reference.")
@click.option("--work", default="/tmp/bench-numerics", type=click.Path(path_type=Path), help="Scratch folder.")
@click.option("--set", "extra", multiple=True, help="KEY=VALUE: an SFT_ setting for every run, e.g. max_length=2048.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the runs (every loss) here.")
def main(model: str, data: str, steps: int, optimizers: str, work: Path, extra: tuple[str, ...],
         json_out: Path | None) -> None:
    work.mkdir(parents=True, exist_ok=True)
    settings = dict(item.split("=", 1) for item in extra)
    runs = [run(o, model, data, steps, work, settings) for o in optimizers.split(",")]
    click.echo(f"{model}, {data}, {steps} steps" + "".join(f", {k}={v}" for k, v in settings.items()))
    ref = runs[0].get("losses") or []
    tail = max(1, min(100, steps // 3))
    click.echo(f"{'optimizer':<12}{'exit':>5}{'stage':>8}{'loss last':>11}{'mean gap':>10}{'max |gap|':>10}"
               f"{'s/step':>8}{'peak GiB':>10}{'planned':>9}")
    for r in runs:
        losses = r.get("losses") or []
        n = min(len(losses), len(ref))
        gaps = [losses[i] - ref[i] for i in range(n)]
        r["mean_gap_last"] = statistics.fmean(gaps[-tail:]) if gaps else None
        r["max_abs_gap"] = max((abs(g) for g in gaps), default=None)
        r["mean_loss_last"] = statistics.fmean(losses[-tail:]) if losses else None

        def shown(value, form):
            return "-" if value is None else format(value, form)

        click.echo(f"{r['optimizer']:<12}{r['exit_code']:>5}{str(r.get('stage')):>8}"
                   f"{shown(r['mean_loss_last'], '.4f'):>11}{shown(r['mean_gap_last'], '+.4f'):>10}"
                   f"{shown(r['max_abs_gap'], '.4f'):>10}{shown(r.get('median_step_seconds'), '.3f'):>8}"
                   f"{shown(r.get('peak_reserved_gib'), '.1f'):>10}{shown(r.get('predicted_peak_gib'), '.1f'):>9}")
    click.echo(f"loss last / mean gap: over the last {tail} steps; gap: this run's loss less {runs[0]['optimizer']}'s, "
               "step by step")
    if json_out:
        json_out.write_text(json.dumps({"steps": steps, "model": model, "data": data, "settings": settings,
                                        "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
