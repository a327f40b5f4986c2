#!/usr/bin/env python3
"""The whole run, not the steady step: runs the job itself (`entrypoint.py run`, a new output folder) and prints
where its wall time went, from the job's own records (run/summary.json's phases, run/events.jsonl, the ranks'
reports), from this script's launch of the entrypoint to its exit:

    start to decision      the process's start, the settings, the data, the plan and preflight
    probe                  the batch search and the probe, less the probe's steps when the training went on from
                           them (those are counted with the steps)
    steps                  seconds inside the optimizer steps (rank 0's clock, evaluation, saves and the wait for
                           the probe's verdict left out)
    blocked by saves       the steps' wait for each checkpoint (checkpoint_saved's seconds)
    evaluation             evaluation during training
    final model            from the last step (and its save, where the end saves one) to the final model's last
                           file (the Trainer's own end too)
    end                    the ranks' exit, the final uploads, the summary, the exit; of it (not in the sum): the
                           removal of the checkpoints the end retired (rank 0's wait for its writer after final/;
                           near 0 where a finished run's removal goes on behind the ranks' end),
                           from rank 0's report to the job's exit (the ranks' teardown, the launcher's, the
                           controller's end), and the final uploads
    other                  what is left: the training ranks' launch and their start before the first step

and beside the steps, not in the sum: the checkpoints' background writes (checkpoint_written: seconds, bytes) and
the uploads (upload_finished's seconds). goodput = steps / wall. Tokens / wall and, where the GPU's peak is known
(scripts/bench.py's convention: 6N FLOPs per token, peak in PEAK), MFU per GPU over the whole run.

    python scripts/bench_epoch.py [--set key=value ...] [--compare] [--json OUT] [--work DIR] [--clean]

Written for the CPU here (the demo model and data, two CPU ranks) as for a GPU machine: with `--set model=DIR` the
demo's settings are left out. `--compare`: the cadence before issue 42 (SFT_SAVE_STEPS=200, synchronous saves with
SFT_SAVE_BACKGROUND=false) against the new defaults, in one invocation, each in its own folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from sft.events import read_events  # noqa: E402  (the job's own reader of its events)

DEMO = dict(model=str(REPO / "demo" / "tiny-qwen3"), dataset=str(REPO / "demo" / "chat.jsonl"), max_length="128",
            micro_batch="1", grad_accum="1", probe_steps="10", learning_rate="2e-3")
OLD_CADENCE = dict(save_steps="200", save_background="false")  # the README's recipe before issue 42, saves in the step
# bf16 dense FLOP/s by a word of the device's name: the H200's is the one measured here, and scripts/bench.py
# divides by it on every device, the H100 included (the same chip; its own peak is not measured here)
PEAK = {"H200": 790e12, "H100": 790e12}
SUMMED = ("start to decision", "probe", "steps", "blocked by saves", "evaluation", "final model", "end", "other")


def run_job(settings: dict[str, str], out: Path) -> tuple[int, float, float]:
    """The job on these settings in `out`: its exit code, and the wall clock at its launch and at its exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFT_")}
    env.update({f"SFT_{k.upper()}": v for k, v in settings.items()}, SFT_OUTPUT_DIR=str(out))
    env.setdefault("HF_HUB_OFFLINE", "0" if "hub_repo" in settings else "1")
    launched = time.time()
    with open(out.parent / f"{out.name}.log", "w") as log:
        code = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "run"], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT).returncode
    return code, launched, time.time()


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def steps_seconds(rank0: dict, saves: list[dict], upto: int | None = None) -> float:
    """Seconds inside the steps up to step `upto` (all: None): rank 0's clock from its loop's start to that step's
    end (its clock leaves evaluation and the verdict's wait out), less the saves between them."""
    steps = [s for s in rank0.get("steps") or [] if upto is None or s[0] <= upto]
    if not steps or rank0.get("train_began") is None:
        return 0.0
    last = steps[-1][0]
    blocked = sum(e["seconds"] for e in saves if e["step"] < last)  # a save at `last` comes after its end
    return max(steps[-1][1] - rank0["train_began"] - blocked, 0.0)


def account(out: Path, launched: float, exited: float) -> dict:
    """The run's phase table and figures, from its records."""
    run = out / "run"
    summary, rank0 = _json(run / "summary.json"), _json(run / "reports" / "train-rank0.json")
    events = [e.line() for _, e in read_events(run / "events.jsonl")]
    kinds: dict[str, list[dict]] = {}
    for e in events:
        kinds.setdefault(e["event"], []).append(e)
    written = kinds.get("checkpoint_written", [])
    # a save's seconds run from its step's end, so an evaluation at that step is in them: counted as evaluation
    evals = {e["step"]: (e.get("metrics") or {}).get("eval_runtime", 0.0) for e in kinds.get("eval", [])}
    saves = [{**e, "seconds": e["seconds"] - evals.get(e["step"], 0.0), "eval": evals.get(e["step"], 0.0)}
             for e in kinds.get("checkpoint_saved", [])]
    phases, train = summary.get("phases") or {}, summary.get("train") or {}
    wall = exited - launched
    rows: dict[str, float] = {}
    rows["start to decision"] = (summary.get("started_at", launched) - launched) + sum(
        phases.get(k, 0.0) for k in ("start_to_decision", "preflight", "reshard"))
    went_on = train.get("went_on_from_probe_step")
    rows["probe"] = phases.get("batch_search_and_probe", 0.0) - (steps_seconds(rank0, saves, went_on) if went_on
                                                                  else 0.0)
    rows["steps"] = steps_seconds(rank0, saves)
    rows["blocked by saves"] = sum(e["seconds"] for e in saves)
    rows["evaluation"] = rank0.get("eval_seconds") or 0.0
    rows["final model"], rows["end"] = _final_and_end(out, rank0, saves, exited)
    rows["other"] = wall - sum(rows.values())
    rows = {k: round(v, 2) for k, v in rows.items()}
    ended = rank0.get("ended_wall") or {}
    end_parts = {"removal": ended.get("written", 0) - ended.get("final", ended.get("written", 0)),
                 "report to exit": exited - ended["reported"] if "reported" in ended else None,
                 "final uploads": phases.get("final_uploads")}  # of "end": where it goes
    return {
        "out": str(out), "exit": summary.get("exit_code"), "status": summary.get("status"), "wall_seconds": round(wall, 2),
        "rows": rows, "end_parts": {k: None if v is None else round(v, 2) for k, v in end_parts.items()},
        "saves": len(saves), "goodput": round(rows["steps"] / wall, 4) if wall > 0 else None,
        "background_write_seconds": round(sum(e["seconds"] for e in written), 2) if written else None,
        "background_write_bytes": sum(e.get("bytes") or 0 for e in written) if written else None,
        "uploads": len(kinds.get("upload_finished", [])),
        "upload_seconds": round(sum(e["seconds"] for e in kinds.get("upload_finished", [])), 2),
        "final_uploads_seconds": phases.get("final_uploads"),
        "tokens": train.get("num_tokens"), "world_size": rank0.get("world_size"), "device": rank0.get("device"),
        "steady_tokens_per_second": train.get("steady_tokens_per_second"),
    }


def _final_and_end(out: Path, rank0: dict, saves: list[dict], exited: float) -> tuple[float, float]:
    """(final model, end): from the last step's save to the final model's newest file, and from there to the exit.
    Not clipped at zero: a negative figure would say that some time was counted twice."""
    # the folder's own time too: where final/ is hard links to the last checkpoint's files (sft/ranks/final.py), their
    # times are the checkpoint's, and the folder's is when the last link was made
    files = [p.stat().st_mtime for p in (out / "final").rglob("*") if p.is_file()]
    files += [(out / "final").stat().st_mtime] if files else []
    steps, began_wall = rank0.get("steps") or [], rank0.get("train_began_wall")
    if not files or not steps or began_wall is None:
        return 0.0, 0.0
    last = next((e for e in saves if e["step"] == steps[-1][0]), {"seconds": 0.0, "eval": 0.0})
    # the steps' clock leaves out evaluation and the verdict's wait before each step; the last step's evaluation
    # (with its save) comes after it
    last_step_wall = (began_wall + steps[-1][1] - rank0["train_began"] + (rank0.get("eval_seconds") or 0.0)
                      - last["eval"] + (rank0.get("held_seconds") or 0.0))
    return max(files) - last_step_wall - last["eval"] - last["seconds"], exited - max(files)


def add_rates(row: dict, settings: dict[str, str]) -> None:
    """Tokens per second of wall time, and MFU per GPU where the device's peak is known."""
    wall, tokens = row["wall_seconds"], row.get("tokens")
    if not tokens or wall <= 0:
        return
    row["tokens_per_second_wall"] = round(tokens / wall, 1)
    peak = next((p for word, p in PEAK.items() if word in (row.get("device") or "")), None)
    if peak:
        from bench import matmul_params  # scripts/bench.py: N, the parameters in a matmul per token

        n = matmul_params(settings.get("model", DEMO["model"]))
        row["mfu"] = round(row["tokens_per_second_wall"] / (row["world_size"] or 1) * 6 * n / peak, 4)


def table(runs: list[dict]) -> str:
    """The phase table, one column per run."""
    names = [r["name"] for r in runs]
    width = max(len(n) for n in names) + 2
    lines = [f"{'seconds':<22}" + "".join(f"{n:>{max(width, 10)}}" for n in names)]

    def line(label: str, values: list) -> None:
        lines.append(f"{label:<22}" + "".join(f"{'-' if v is None else v:>{max(width, 10)}}" for v in values))

    for key in SUMMED:
        line(key, [r["rows"].get(key) for r in runs])
    for key in runs[0]["end_parts"]:
        line(f"  end: {key}", [r["end_parts"].get(key) for r in runs])
    line("wall (launch to exit)", [r["wall_seconds"] for r in runs])
    line("checkpoints saved", [r["saves"] for r in runs])
    line("background writes", [r["background_write_seconds"] for r in runs])
    line("uploads (beside)", [f"{r['uploads']}: {r['upload_seconds']}" for r in runs])
    line("goodput", [f"{r['goodput']:.1%}" if r["goodput"] is not None else None for r in runs])
    line("tokens/s (wall)", [r.get("tokens_per_second_wall") for r in runs])
    line("MFU/GPU (wall)", [f"{r['mfu']:.1%}" if "mfu" in r else "n/a" for r in runs])
    line("exit code", [r["exit"] for r in runs])
    return "\n".join(lines)


@click.command()
@click.option("--set", "overrides", multiple=True, help="KEY=VALUE: an SFT_ setting over the demo's; with "
              "model=DIR, over the job's defaults.")
@click.option("--compare", is_flag=True, help="Also run the old cadence (SFT_SAVE_STEPS=200, SFT_SAVE_BACKGROUND=false) "
              "before the new defaults.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Write the figures here.")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), help="Folder for the output folders and "
              "logs (default: a new one in TMPDIR).")
@click.option("--clean", is_flag=True, help="Delete each run's checkpoints and final model once its figures are taken, for a disk "
              "that holds one run's and not two.")
def main(overrides: tuple[str, ...], compare: bool, json_out: Path | None, work: Path | None, clean: bool) -> None:
    own = dict(o.split("=", 1) for o in overrides)
    settings = {**({} if "model" in own else DEMO), **own}
    work = work or Path(tempfile.mkdtemp(prefix="bench-epoch-"))
    work.mkdir(parents=True, exist_ok=True)
    plans = [("new", settings)]
    if compare:
        old = {k: v for k, v in settings.items() if k != "save_minutes"}
        plans.insert(0, ("old", {**old, **OLD_CADENCE}))
    runs = []
    for name, these in plans:
        code, launched, exited = run_job(these, work / f"out-{name}")
        row = {"name": name, "settings": these, **account(work / f"out-{name}", launched, exited), "exit": code}
        add_rates(row, these)
        runs.append(row)
        if clean:
            for folder in [*(work / f"out-{name}").glob("checkpoint-*"), work / f"out-{name}" / "final"]:
                shutil.rmtree(folder, ignore_errors=True)
        if json_out:  # a cut-off invocation keeps the runs it made
            json_out.write_text(json.dumps(runs, indent=1))
    click.echo(table(runs))
    click.echo(f"records and logs: {work}")
    sys.exit(max(r["exit"] for r in runs) and 1)


if __name__ == "__main__":
    main()
