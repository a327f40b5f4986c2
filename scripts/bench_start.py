#!/usr/bin/env python3
"""From start to the first step: the job's `probe` on the demo model and data (or yours), run in turn from one or
more checkouts of this project, each run in a new output folder. Prints, per run, the seconds from this script's
launch of the entrypoint to rank 0's first step (the same clock for any version of the job), the job's own
figures (seconds_to_first_step, the phases), the warm-up and the steady seconds per step.

    python scripts/bench_start.py [--checkout DIR ...] [--runs 3] [--again] [--set max_length=128 ...]

Two checkouts (say a copy of an older commit, `git worktree add /tmp/A COMMIT`, and this one) alternate A B A B,
so that a machine's drift falls on both. Written for the CPU here as for a GPU machine: on CPU the job runs
SFT_CPU_RANKS ranks (2) of the demo model. With `--set model=DIR` the demo's settings are left out: the job's
defaults and your --set. `--again`: each run is followed by a second start in its output folder, which finds
the first's compile caches (its warm-up against the first's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
DEMO = dict(model=str(REPO / "demo" / "tiny-qwen3"), dataset=str(REPO / "demo" / "chat.jsonl"), max_length="128",
            micro_batch="1", grad_accum="1", probe_steps="10", learning_rate="2e-3")


def one_run(checkout: Path, settings: dict[str, str], out: Path, log_name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFT_")}
    env.update({f"SFT_{k.upper()}": v for k, v in settings.items()}, SFT_OUTPUT_DIR=str(out), HF_HUB_OFFLINE="1")
    began = time.time()
    with open(out.parent / log_name, "w") as log:
        code = subprocess.run([sys.executable, str(checkout / "entrypoint.py"), "probe"], cwd=checkout, env=env,
                              stdout=log, stderr=subprocess.STDOUT).returncode
    summary = json.loads((out / "run" / "summary.json").read_text()) if (out / "run" / "summary.json").exists() else {}
    rank0 = out / "run" / "reports" / "probe-rank0.json"
    first = json.loads(rank0.read_text()).get("first_step_wall") if rank0.exists() else None
    probe = summary.get("probe") or {}
    return {"checkout": str(checkout), "out": str(out), "exit": code,
            "launch_to_first_step": first and round(first - began, 2),
            "seconds_to_first_step": probe.get("seconds_to_first_step"), "warmup_seconds": probe.get("warmup_seconds"),
            "seconds_per_step": probe.get("seconds_per_step"), "tokens_per_second": probe.get("tokens_per_second"),
            "phases": summary.get("phases")}


@click.command()
@click.option("--checkout", "checkouts", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A checkout of this project to run (repeat to alternate); default: this one.")
@click.option("--runs", default=3, show_default=True, help="Runs of each checkout.")
@click.option("--again", is_flag=True, help="After each run, a second start in its output folder.")
@click.option("--set", "overrides", multiple=True, help="KEY=VALUE: an SFT_ setting over the demo's; with "
              "model=DIR, over the job's defaults.")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), help="Folder for the figures, logs and "
              "output folders (default: a new one in TMPDIR).")
def main(checkouts: tuple[Path, ...], runs: int, again: bool, overrides: tuple[str, ...], work: Path | None) -> None:
    own = dict(o.split("=", 1) for o in overrides)
    settings = {**({} if "model" in own else DEMO), **own}
    work = work or Path(tempfile.mkdtemp(prefix="bench-start-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(runs):
        for j, checkout in enumerate(checkouts or (REPO,)):
            for start in ("first", "again") if again else ("first",):
                row = {"start": start, **one_run(checkout.absolute(), settings, work / f"out-{i}-{j}",
                                                   f"out-{i}-{j}-{start}.log")}
                rows.append(row)
                click.echo(f"{row['checkout']} ({start} start): exit {row['exit']}, {row['launch_to_first_step']} s "
                           f"from launch to the first step (the job's own: {row['seconds_to_first_step']} s), "
                           f"warm-up {row['warmup_seconds']} s, {row['seconds_per_step']} s a step; "
                           f"phases {row['phases']}")
                (work / "bench-start.json").write_text(json.dumps(rows, indent=1))  # a cut-off run keeps its rows
    click.echo(f"figures and logs: {work}")


if __name__ == "__main__":
    main()
