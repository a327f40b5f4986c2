"""Checkpoints by time (SFT_SAVE_MINUTES, by default the upload interval) or by steps (SFT_SAVE_STEPS): the real job
on two CPU ranks, steps slowed by SFTTEST_STEP_SECONDS so that the minutes hold a few steps (issue 42)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, clean_environ, demo_env, read_summary, run_entrypoint
from sft import checkpoints, exitcodes
from sft.events import CheckpointSaved, Evaluated, read_events
from sft.ranks.cadence import SaveClock

pytestmark = pytest.mark.slow

STEP_SECONDS = 0.4  # each step slowed by this much (sft/dev/faults.py)
SAVE_MINUTES = 0.02  # 1.2 s: at least 3 slowed steps between two checkpoints
STEPS = 16
JOB = dict(zero_stage="2", probe_steps=3, max_steps=STEPS, save_total_limit=100, logging_steps=1, precision="fp32",
           seed=0, packing="false", micro_batch=1, grad_accum=1, max_length=128)


def slowed(env: dict[str, str]) -> dict[str, str]:
    return {**env, "SFTTEST_STEP_SECONDS": str(STEP_SECONDS)}


def saves(out: Path) -> list[int]:
    return [e.step for _, e in read_events(out / "run" / "events.jsonl") if isinstance(e, CheckpointSaved)]


@pytest.fixture(scope="module")
def by_time(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One run saving by time, evaluating with each checkpoint (no SFT_EVAL_STEPS); its probe's steps are the
    training's first, during which nothing may be saved. scripts/bench_epoch.py runs it, so its table is tested on
    the same run."""
    tmp = tmp_path_factory.mktemp("by-time")
    settings = {**JOB, "save_minutes": SAVE_MINUTES, "eval_fraction": 0.05}
    command = [sys.executable, str(REPO / "scripts" / "bench_epoch.py"), "--work", str(tmp), "--json",
               str(tmp / "bench.json"), *(f"--set={k}={v}" for k, v in settings.items())]
    result = subprocess.run(command, env=slowed(clean_environ(tmp)), cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    return result, tmp / "out-new"


def test_checkpoints_are_saved_by_time_by_every_rank_at_once(by_time):
    result, out = by_time
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + _log(out)
    steps = saves(out)
    # the Trainer saves nothing by itself (save_strategy "no"): every save is the clock's, and the end saves none
    assert len(steps) >= 3 and steps[-1] < STEPS, steps
    assert steps[0] > JOB["probe_steps"], steps  # not before the probe's verdict
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert all(g >= SAVE_MINUTES * 60 / STEP_SECONDS for g in gaps), steps
    # a save is a collective: a rank that saved alone would hang the others, or leave a checkpoint without its shards
    for step in steps:
        assert checkpoints.problem(out / f"checkpoint-{step}") is None, step
    assert sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")) == steps


def test_evaluation_goes_with_each_checkpoint_saved_by_time(by_time):
    result, out = by_time
    assert result.returncode == 0, result.stdout[-3000:]
    evaluated = [e.step for _, e in read_events(out / "run" / "events.jsonl") if isinstance(e, Evaluated)]
    assert evaluated == saves(out) + [STEPS]  # and the end, which saves no checkpoint


def test_the_end_writes_the_model_alone_not_a_checkpoint(by_time):
    """By time the last step saves no checkpoint (disk.end_checkpoint): final/ is written by save_model, whole and
    loadable, and the run's newest checkpoint is the clock's last."""
    from transformers import AutoModelForCausalLM

    result, out = by_time
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"checkpoint-{STEPS}" not in [p.name for p in out.glob("checkpoint-*")]
    log = (out.parent / f"{out.name}.log").read_text()
    assert "final model: " in log and "written (the end saved no checkpoint to link)" in log
    final = out / "final"
    assert not list(final.glob("*optim*")) and not list(final.glob("global_step*"))  # the model, no training state
    assert AutoModelForCausalLM.from_pretrained(final).num_parameters() > 0


def test_no_checkpoint_by_time_just_before_the_end_which_saves_anyway():
    """The clock's rule, with the seconds of steps left that rank 0 measures: due, it asks for a save unless the end
    comes within a tenth of the interval (the last step saves then), and it asks once per interval."""
    clock = SaveClock(interval_s=60.0, rank0=True)
    clock.since -= 61  # an interval since the last save
    assert clock.ask(500, left_s=5.9) is False  # the end in under 6 s: its own save comes
    assert clock.ask(500, left_s=None) is True  # steps left unknown (no rate yet): saves when due
    assert clock.ask(501, left_s=600.0) is False  # asked already: the answer is on its way
    clock.saved()
    clock.since -= 61
    assert clock.ask(900, left_s=6.0) is True  # a tenth of the interval away: still worth a save
    other = SaveClock(interval_s=60.0, rank0=False)
    other.since -= 61
    assert other.ask(500, left_s=600.0) is False  # only rank 0 asks


def test_save_steps_win_over_the_upload_interval(tmp_path):
    """SFT_SAVE_STEPS set: by steps, though the upload interval (the time cadence's default) would save more often."""
    env = slowed(demo_env(tmp_path, save_steps=5, upload_minutes=SAVE_MINUTES, **{**JOB, "probe_steps": 0,
                                                                                   "max_steps": 12}))
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert saves(tmp_path / "out") == [5, 10, 12]


def test_minutes_and_steps_together_are_refused_naming_both(tmp_path):
    result = run_entrypoint(demo_env(tmp_path, save_minutes=10, save_steps=50, save_total_limit=0))
    assert result.returncode == exitcodes.BAD_SETTINGS, result.stdout[-3000:] + result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "SFT_SAVE_MINUTES='10.0': not with SFT_SAVE_STEPS=50" in said and "SFT_SAVE_TOTAL_LIMIT" in said
    assert not (tmp_path / "out").exists()


def test_sigterm_saves_at_once_between_two_checkpoints_by_time(tmp_path):
    """The default cadence (30 minutes) saves nothing in these steps: a SIGTERM saves where it comes."""
    env = slowed(demo_env(tmp_path, **{**JOB, "probe_steps": 0, "max_steps": 200}))
    out, log = tmp_path / "out", tmp_path / "job.log"
    with open(log, "w") as sink:  # a file, not a pipe: an unread pipe fills up and blocks the job
        proc = subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while _step(out) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=300)
    assert proc.returncode == 143, log.read_text()[-3000:]
    stopped_at = read_summary(out)["train"]["global_step"]
    assert saves(out) == [stopped_at] and 4 <= stopped_at < 200
    assert checkpoints.problem(out / f"checkpoint-{stopped_at}") is None


def _step(out: Path) -> int:
    try:
        return json.loads((out / "run" / "progress.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def test_bench_epoch_prints_the_phase_table_of_the_run(by_time):
    """scripts/bench_epoch.py on the demo: every row of its table, and a goodput that is a fraction of the wall."""
    result, out = by_time
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + _log(out)
    labels = [line[:22].strip() for line in result.stdout.splitlines()]
    for row in ("start to decision", "probe", "steps", "blocked by saves", "evaluation", "final model", "end", "other",
                "wall (launch to exit)", "background writes", "uploads (beside)", "goodput", "tokens/s (wall)",
                "MFU/GPU (wall)"):
        assert row in labels, result.stdout
    [run] = json.loads((out.parent / "bench.json").read_text())
    assert 0 < run["goodput"] < 1 and run["exit"] == 0 and run["saves"] == len(saves(out))
    rows = run["rows"]
    assert rows["steps"] > STEPS * STEP_SECONDS * 0.9  # the slowed steps are inside the steps
    assert rows["blocked by saves"] > 0 and rows["end"] > 0
    # final/ is links to the last checkpoint's files (sft/ranks/final.py): a few ms, never before the last save's end
    assert rows["final model"] >= 0
    assert rows["other"] >= 0  # nothing counted twice: the rows never add up to more than the wall
    assert run["tokens_per_second_wall"] > 0 and "mfu" not in run  # no known peak on CPU


def _log(out: Path) -> str:
    log = out.parent / f"{out.name}.log"
    return log.read_text()[-3000:] if log.exists() else ""
