#!/usr/bin/env python3
"""The planner against the GPU: predicted peak per GPU against torch.cuda.max_memory_reserved, on a grid.

For every point of stages x micro-batches x max_lengths x gradient checkpointing, the job's own
`entrypoint.py probe` runs with those settings given explicitly (packing on, so every row is max_length
tokens long: the planner's worst case). The predicted figure is the plan's row for that stage from the
run's summary.json; the measured one the largest of the ranks' max_memory_reserved from probe.json.

The plan's peak includes CUDA_CONTEXT_GIB (the CUDA context, cuBLAS workspace, NCCL buffers) that torch's
allocator never counts, so the comparison is on what the allocator holds: predicted = peak - context.
Target (issue 4): within 10% on every point, never more than 5% under (an under-prediction is a user's
out-of-memory crash). A point whose probe ran out of memory is printed as OOM with what the plan said.

Each point is appended to WORK/memory.jsonl as it finishes and skipped when the script runs again, so a
grid longer than one 10-minute device call is measured over several calls:

    python scripts/bench_memory.py --model DIR --data FILE [--stages 2,3] [--micro-batches 1,2]
        [--lengths 2048,4096] [--checkpointing on,off] [--steps 8] [--work /tmp/bench-memory]
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from bench import run_probe  # noqa: E402  (after the path: the script runs from anywhere)
from sft.planner.memory import CUDA_CONTEXT_GIB  # noqa: E402

OVER, UNDER = 0.10, 0.05  # the target: at most 10% over, 5% under


def point_name(stage: str, micro_batch: int, max_length: int, checkpointing: str) -> str:
    return f"z{stage}-mb{micro_batch}-len{max_length}-ckpt{checkpointing}"


def measure(model: str, data: str, steps: int, work: Path, stage: str, micro_batch: int, max_length: int,
            checkpointing: str, gpus: str = "all") -> dict:
    """One probe with these settings; the plan's prediction and the measured peak from its output."""
    name = point_name(stage, micro_batch, max_length, checkpointing)
    probed = run_probe(name, model, data, steps, work, settings=dict(
        zero_stage=stage, micro_batch=micro_batch, grad_accum=1, max_length=max_length, packing="true",
        gradient_checkpointing="true" if checkpointing == "on" else "false", gpus=gpus))
    row = {"point": name, "stage": stage, "micro_batch": micro_batch, "max_length": max_length,
           "checkpointing": checkpointing, "exit": probed["exit"], "wall_s": probed["wall_s"]}
    summary_file = work / name / "run" / "summary.json"  # the plan the job made for these settings
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    option = next((o for o in summary.get("plan", {}).get("options", []) if o["option"] == stage), None)
    if option:
        row["plan_peak_gib"] = option["peak"]
        row["predicted_gib"] = round(option["peak"] - CUDA_CONTEXT_GIB, 2)
        row["plan_fits"] = option["fits"]
        row["gpu_budget_gib"] = summary["plan"]["setup"]["gpu_budget"]
    if probed.get("peak_reserved_gib"):
        row["measured_gib"] = max(probed["peak_reserved_gib"])
        row["tokens_per_second"] = probed.get("tokens_per_second")
    if row.get("measured_gib") and row.get("predicted_gib"):
        row["error"] = round(row["predicted_gib"] / row["measured_gib"] - 1, 4)
        row["on_target"] = -UNDER <= row["error"] <= OVER
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'stage':>11} {'mb':>3} {'len':>5} {'ckpt':>4} {'predicted':>9} {'measured':>9} {'error':>7} "
            f"{'target':>7} {'tok/s':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        measured = f"{r['measured_gib']:.2f}" if r.get("measured_gib") else ("OOM" if r["exit"] == 4 else "-")
        error = f"{r['error']:+.1%}" if "error" in r else "-"
        target = ("ok" if r["on_target"] else ("UNDER" if r["error"] < -UNDER else "over")) if "error" in r else "-"
        lines.append(f"{r['stage']:>11} {r['micro_batch']:>3} {r['max_length']:>5} {r['checkpointing']:>4} "
                     f"{r.get('predicted_gib', float('nan')):>9.2f} {measured:>9} {error:>7} {target:>7} "
                     f"{r.get('tokens_per_second') or 0:>8.0f}")
    return "\n".join(lines)


def csv(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


@click.command()
@click.option("--model", required=True, help="Model folder (scripts/make_synthetic.py makes one).")
@click.option("--data", required=True, help="Chat data (.jsonl), long enough to fill max_length rows packed.")
@click.option("--stages", default="2,3", show_default=True, help="ZeRO options: 1, 2, 3, 3-offload, 3-offload-all.")
@click.option("--micro-batches", default="1,2", show_default=True)
@click.option("--lengths", default="2048,4096", show_default=True, help="max_length values.")
@click.option("--checkpointing", default="on,off", show_default=True)
@click.option("--steps", default=8, show_default=True, help="Probe steps per point (the peak comes early).")
@click.option("--work", default="/tmp/bench-memory", type=click.Path(path_type=Path), help="Scratch folder.")
@click.option("--deadline", default=0.0, help="Seconds after which no new point starts (0: none).")
@click.option("--gpus", default="all", show_default=True, help="SFT_GPUS for every point.")
def main(model, data, stages, micro_batches, lengths, checkpointing, steps, work, deadline, gpus) -> None:
    work.mkdir(parents=True, exist_ok=True)
    results = work / "memory.jsonl"
    done = {json.loads(line)["point"]: json.loads(line) for line in results.read_text().splitlines()} \
        if results.exists() else {}
    started = time.monotonic()
    grid = itertools.product(csv(stages), map(int, csv(micro_batches)), map(int, csv(lengths)), csv(checkpointing))
    rows = []
    for stage, mb, length, ckpt in grid:
        name = point_name(stage, mb, length, ckpt)
        if name not in done:
            if deadline and time.monotonic() - started > deadline:
                click.echo(f"deadline: {name} and later points not measured; run again to go on", err=True)
                break
            done[name] = measure(model, data, steps, work, stage, mb, length, ckpt, gpus)
            with open(results, "a") as f:
                f.write(json.dumps(done[name]) + "\n")
            click.echo(json.dumps(done[name]), err=True)
        rows.append(done[name])
    click.echo(f"\npredicted: the plan's peak less {CUDA_CONTEXT_GIB} GiB of CUDA context (not in torch's "
               f"counters); measured: max_memory_reserved, largest rank; target -{UNDER:.0%} to +{OVER:.0%}")
    click.echo(table(rows))
    scored = [r for r in rows if "error" in r]
    if scored:
        worst_over, worst_under = max(r["error"] for r in scored), min(r["error"] for r in scored)
        click.echo(f"{sum(r['on_target'] for r in scored)} of {len(scored)} points on target; "
                   f"error from {worst_under:+.1%} to {worst_over:+.1%}")


if __name__ == "__main__":
    main()
