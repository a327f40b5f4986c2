"""W&B and MLflow, as the image has them, across a stop and a resume: the real job (entrypoint.py as a subprocess, two
CPU ranks) on the demo model, logging to both offline (W&B's offline run files, MLflow's local file store), stopped
by SIGTERM after a checkpoint, then started again. One run pair serves every test here, and `config --env` reads
that job's settings back from its output folder while it runs and after it ended."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, demo_env, read_summary, run_entrypoint, step_losses

from sft.settings import from_env

pytestmark = pytest.mark.slow

STEPS = 40  # room for a stop that lands late on a loaded machine (seen at step 14 of 16)
JOB = dict(zero_stage="2", probe_steps=3, save_steps=4, max_steps=STEPS, logging_steps=1, precision="fp32", seed=0,
           packing="false", report_to="wandb,mlflow", run_name="resumed-run")
SECRET = "wandb-key-that-must-stay-out-0123456789"


@dataclass
class Pair:
    env: dict[str, str]
    out: Path
    first_code: int
    first_runs: dict  # run/trackers.json after the first start
    running_env_file: subprocess.CompletedProcess  # `config --env OUT` while the first start ran


def _start(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # a file, not a pipe: an unread pipe fills and blocks the job
        return subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    tmp = tmp_path_factory.mktemp("trackers")
    env = demo_env(tmp, **JOB)
    # offline: no account, no network; W&B's own folders (settings, cache) under tmp, not the user's home
    env.update(WANDB_MODE="offline", WANDB_API_KEY=SECRET, WANDB_CONFIG_DIR=str(tmp / "wandb-config"),
               WANDB_CACHE_DIR=str(tmp / "wandb-cache"), WANDB_DATA_DIR=str(tmp / "wandb-data"))
    out, log = tmp / "out", tmp / "first.log"
    proc = _start(env, log)
    deadline = time.monotonic() + 400
    while not (out / "checkpoint-4" / "trainer_state.json").exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    running = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "config", "--env", str(out)], env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    os.kill(proc.pid, signal.SIGTERM)  # docker stop
    proc.wait(timeout=400)
    runs = json.loads((out / "run" / "trackers.json").read_text())
    second = run_entrypoint(env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    return Pair(env, out, proc.returncode, runs, running)


def wandb_records(path: Path) -> list:
    """The records of a W&B run file (.wandb): LevelDB's log format, 32 KiB blocks of chunks, each with a 7-byte
    header (checksum, length, type: 1 full, 2 first, 3 middle, 4 last), after the file's own 7-byte header. wandb
    0.31 reads these only in its Go core, so the format is read here by hand; the records are its own protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def wandb_losses(path: Path) -> dict[int, float]:
    """train/loss by train/global_step, as the Trainer's WandbCallback logged them."""
    losses = {}
    for r in wandb_records(path):
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            if "train/loss" in items:
                losses[items["train/global_step"]] = items["train/loss"]
    return losses


def test_the_first_start_stopped_at_a_checkpoint(pair):
    assert pair.first_code == 143
    assert pair.first_runs.keys() == {"wandb", "mlflow"} and all(pair.first_runs.values())


def test_both_starts_logged_to_the_same_wandb_run_and_its_steps_go_on(pair):
    summary = read_summary(pair.out)
    resumed = int(Path(summary["resumed_from"]).name.split("-")[1])
    runs = sorted((pair.out / "run" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, runs  # one offline run folder per start
    run_id = pair.first_runs["wandb"]
    assert all(r.name.endswith(f"-{run_id}") for r in runs)
    assert json.loads((pair.out / "run" / "trackers.json").read_text())["wandb"] == run_id
    first, second = (wandb_losses(r / f"run-{run_id}.wandb") for r in runs)
    assert first and max(first) == resumed and second and min(second) == resumed + 1
    expected = step_losses(summary)  # the run's losses, every step once (logging_steps=1)
    assert {**first, **second} == pytest.approx(expected)
    assert sorted(expected) == list(range(1, summary["train"]["global_step"] + 1))
    for r in runs:
        (meta,) = [x.run for x in wandb_records(r / f"run-{run_id}.wandb") if x.WhichOneof("record_type") == "run"]
        assert (meta.run_id, meta.display_name) == (run_id, "resumed-run")


def test_both_starts_logged_to_the_same_mlflow_run_and_its_steps_go_on(pair):
    run_id = pair.first_runs["mlflow"]
    runs = [p for p in (pair.out / "run" / "mlruns" / "0").iterdir() if p.is_dir()]
    assert [r.name for r in runs] == [run_id]  # MLflow's local file store, under the output folder
    lines = (runs[0] / "metrics" / "loss").read_text().split("\n")
    logged = {int(step): float(value) for _, value, step in (line.split() for line in lines if line)}
    summary = read_summary(pair.out)
    assert logged == pytest.approx(step_losses(summary))
    assert sorted(logged) == list(range(1, summary["train"]["global_step"] + 1))
    assert "status: 3" in (runs[0] / "meta.yaml").read_text()  # FINISHED: the second start ended the run


def test_no_tracker_key_is_written(pair):
    for path in pair.out.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_config_env_reproduces_the_jobs_settings_running_and_ended(pair):
    """The env file `config --env OUT` prints, read back as `docker run --env-file` reads it, gives the settings the
    job recorded; the secret in the job's environment is not in it."""
    ended = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "config", "--env", str(pair.out)],
                           env=pair.env, cwd=REPO, capture_output=True, text=True, timeout=120)
    recorded = json.loads((pair.out / "run" / "settings.json").read_text())
    for printed in (pair.running_env_file, ended):
        assert printed.returncode == 0, printed.stderr[-3000:]
        assert SECRET not in printed.stdout + printed.stderr
        variables = dict(line.split("=", 1) for line in printed.stdout.splitlines() if line and line[0] != "#")
        assert "SFT_REPORT_TO" in variables and all(k.startswith("SFT_") for k in variables)
        assert from_env(variables).to_dict() == recorded


def test_trackers_the_run_does_not_name_are_absent_in_the_ranks_and_the_libraries_import_without_them(tmp_path):
    """transformers' wandb check and DeepSpeed's autotuner import wandb and mlflow whatever report_to says (a second
    or more of every process's start): in the ranks (through the controller's variable) those the run does not name
    are absent, and the libraries the ranks import still import. Without the variable both are imported: the day
    this fails there, the libraries stopped and sft/tracking.py's `hide` can go."""
    from sft import tracking

    assert tracking.unused("wandb", None) == ["mlflow"] and tracking.unused("none", None) == ["wandb", "mlflow"]
    assert tracking.unused("none", str(tmp_path / "ds.json")) == []  # a user's DeepSpeed monitor may name them
    code = ("import sys, importlib.util, sft.ranks, deepspeed, trl.trainer.sft_trainer, transformers.trainer; "
            "print([n for n in ('wandb', 'mlflow') if sys.modules.get(n) is not None], "
            "[importlib.util.find_spec(n) is not None for n in ('wandb', 'mlflow')])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(tracking.UNUSED_VARIABLE, None)
    imported = {}
    for hidden in ("wandb,mlflow", "mlflow", ""):
        done = subprocess.run([sys.executable, "-c", code], env={**env, tracking.UNUSED_VARIABLE: hidden}, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        imported[hidden] = done.stdout.splitlines()[-1]  # after DeepSpeed's own lines
    assert imported == {"wandb,mlflow": "[] [False, False]", "mlflow": "['wandb'] [True, False]",
                        "": "['wandb', 'mlflow'] [True, True]"}
