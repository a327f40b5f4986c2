#!/usr/bin/env python3
"""What a resume costs before its first step: a run stopped at a checkpoint (SIGTERM: it saves and uploads one), then
started again on the same disk, then on an empty disk, which downloads that checkpoint from the Hub first. Prints, per
start, the seconds from this script's launch of the entrypoint to rank 0's first step, and for the Hub's start the
download and its check (the job's own line: bytes, seconds, MB/s).

    python scripts/bench_resume.py [--set key=value ...] [--stop-at 20] [--json OUT] [--work DIR]

The Hub is the project's test server (tests/hubserver) on 127.0.0.1, started here: it serves Git LFS as the Hub
does, so a download here measures huggingface_hub's client and the job's check, not the Hub's network. The two
resumed starts are killed (-9, the whole tree) once their first step is done: nothing more of them is measured.
Written for the CPU here (the demo model and data, two CPU ranks) as for a GPU machine: with `--set model=DIR` the
demo's settings are left out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import psutil

from bench_epoch import DEMO, REPO  # scripts/bench_epoch.py: the same demo settings

sys.path.insert(0, str(REPO / "tests"))
from conftest import process_tree, send_signal  # noqa: E402  (the tests' kill of a job's whole tree)
from hub_fixtures import WRITE_TOKEN, client_env, start_hub_process  # noqa: E402  (the project's test Hub)

REPO_ID = "alice/bench-resume"
DOWNLOADED = re.compile(r"resume: (checkpoint-\d+) downloaded from \S+ and verified \((.+?) in ([\d.]+) s, ([\d.]+) "
                        r"MB/s\)")


def start(settings: dict[str, str], out: Path, hub_url: str, log: Path) -> tuple[subprocess.Popen, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFT_")}
    env.update({f"SFT_{k.upper()}": v for k, v in settings.items()}, SFT_OUTPUT_DIR=str(out), SFT_HUB_REPO=REPO_ID)
    env.update(client_env(hub_url, out.parent / f"{out.name}-hf-home"), HF_TOKEN=WRITE_TOKEN)
    del env["HF_HUB_DISABLE_XET"]  # the job chooses its transport itself, as for users
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, str(REPO / "entrypoint.py"), "run"], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True), time.time()


def step_now(out: Path) -> tuple[int, float] | None:
    """(step, when) of rank 0's progress record (run/progress.json: written at a start's first step, then every
    few seconds)."""
    try:
        p = json.loads((out / "run" / "progress.json").read_text())
    except (OSError, ValueError):
        return None
    return p["step"], p["updated"]


def wait_for_step(proc: subprocess.Popen, out: Path, above: int, log: Path, timeout: float) -> float:
    """The wall time of the first step above `above` that rank 0 recorded."""
    deadline = time.monotonic() + timeout
    while (now := step_now(out)) is None or now[0] <= above:
        if proc.poll() is not None:
            raise SystemExit(f"the job exited ({proc.returncode}) before step {above + 1}: {log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no step above {above} in {timeout:.0f} s: {log}")
        time.sleep(0.05)
    return now[1]


def kill_tree(proc: subprocess.Popen) -> None:
    """kill -9 the job and every process under it (the ranks run in a session of their own)."""
    family = process_tree(proc.pid)
    send_signal(family, signal.SIGKILL)
    proc.wait(60)
    psutil.wait_procs(family, timeout=60)


def resumed_start(name: str, log: Path, settings: dict[str, str], out: Path, hub_url: str, stopped_at: int,
                  timeout: float) -> dict:
    proc, launched = start(settings, out, hub_url, log)
    try:
        first = wait_for_step(proc, out, stopped_at, log, timeout)
    finally:
        kill_tree(proc)
    row = {"name": name, "launch_to_first_step": round(first - launched, 2), "log": str(log)}
    if found := DOWNLOADED.search(log.read_text()):
        row.update(checkpoint=found[1], download_size=found[2], download_seconds=float(found[3]),
                   download_mb_per_s=float(found[4]))
    return row


@click.command()
@click.option("--set", "overrides", multiple=True, help="KEY=VALUE: an SFT_ setting over the demo's; with "
              "model=DIR, over the job's defaults.")
@click.option("--stop-at", default=20, show_default=True, help="The first run is stopped (SIGTERM) once rank 0 has "
              "recorded this many steps.")
@click.option("--timeout", default=1800.0, show_default=True, help="Seconds each start may take to its step.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Write the figures here.")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), help="Folder for the output folders, logs "
              "and the Hub's files (default: a new one in TMPDIR).")
def main(overrides: tuple[str, ...], stop_at: int, timeout: float, json_out: Path | None, work: Path | None) -> None:
    own = dict(o.split("=", 1) for o in overrides)
    settings = {**({} if "model" in own else DEMO), **own}
    work = work or Path(tempfile.mkdtemp(prefix="bench-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    hub = start_hub_process(work / "hub")
    try:
        # 1. a first run, stopped as `docker stop` stops it: a checkpoint saved and uploaded, exit 143
        out, log = work / "out", work / "first.log"
        proc, launched = start(settings, out, hub.url, log)
        first = wait_for_step(proc, out, stop_at - 1, log, timeout)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout)
        stopped = step_now(out)
        if code != 143 or stopped is None:  # 0: it ended before the stop came (rank 0 records its step every 2 s)
            raise SystemExit(f"the first run ended with {code}, not 143 (stopped): {log}; where it ended first, a "
                             "longer run (SFT_MAX_STEPS, more data) or SFTTEST_STEP_SECONDS=0.1 (slower steps) helps")
        rows = [{"name": "first start (the probe's launch)", "launch_to_first_step": None,
                 "launch_to_step": round(first - launched, 2), "stopped_at": stopped[0], "log": str(log)}]
        # 2. the same disk; 3. an empty disk: the checkpoint comes from the Hub
        rows.append(resumed_start("resume from this disk", work / "resume-disk.log", settings, out, hub.url,
                                  stopped[0], timeout))
        rows.append(resumed_start("resume from the Hub", work / "resume-hub.log", settings, work / "out-empty",
                                  hub.url, stopped[0], timeout))
    finally:
        hub.stop()
    for row in rows:
        extra = (f"  (download and check: {row['download_size']} in {row['download_seconds']} s, "
                 f"{row['download_mb_per_s']} MB/s)" if "download_seconds" in row else "")
        if row["launch_to_first_step"] is None:
            click.echo(f"{row['name']:<34} stopped at step {row['stopped_at']} (launch to step {stop_at}: "
                       f"{row['launch_to_step']} s)")
        else:
            click.echo(f"{row['name']:<34} launch to first step {row['launch_to_first_step']:>8.2f} s{extra}")
    if json_out:
        json_out.write_text(json.dumps({"settings": settings, "runs": rows}, indent=1))
    click.echo(f"records and logs: {work}")


if __name__ == "__main__":
    main()
