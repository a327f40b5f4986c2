"""`entrypoint.py status --check`, the exec probe of scripts/trainjob.yaml and pytorchjob.yaml: its exit codes on real
output folders: a job running, the same job frozen (SIGSTOP: alive, no step), stopped (exit 143), resumed to the end,
and a folder with no run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, demo_env, process_tree, run_entrypoint, send_signal
from sft.controller import status

pytestmark = pytest.mark.slow

JOB = dict(max_length=64, micro_batch=1, grad_accum=1, max_steps=60, save_steps=5, probe_steps=0, precision="fp32",
           zero_stage="2")


def check(out: Path, *extra: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFT_")}
    done = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "status", str(out), "--check", *extra],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout.strip() + done.stderr.strip()


def _wait(condition, proc: subprocess.Popen, log: Path, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """One job, its folder checked at each stage of its life (each check a real `status --check`)."""
    tmp = tmp_path_factory.mktemp("check")
    out, log, found = tmp / "out", tmp / "job.log", {}
    found["empty"] = check(tmp)  # a folder with nothing of a run in it
    found["missing"] = check(tmp / "nowhere")
    env = demo_env(tmp, **JOB)
    slow = {**env, "SFTTEST_STEP_SECONDS": "0.5"}  # the steps last long enough to look at (sft/dev/faults.py)
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=slow, cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: (out / "run" / "progress.json").exists(), proc, log)
        found["running"] = check(out)
        frozen = process_tree(proc.pid)
        send_signal(frozen, signal.SIGSTOP)  # alive, and no step moves
        time.sleep(4)
        found["frozen"] = check(out, "--stalled-after", "3")
        found["frozen, a longer limit"] = check(out)
        send_signal(frozen, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=400)
    finally:
        send_signal(process_tree(proc.pid), signal.SIGKILL)
    found["stopped"] = check(out)
    found["stopped exit"] = (proc.returncode, log.read_text()[-2000:])
    again = run_entrypoint(env)  # resumes from the stop's checkpoint, at full speed, to the end
    found["again exit"] = (again.returncode, again.stdout[-2000:])
    found["done"] = check(out)
    return found


def test_a_folder_with_no_run_is_3(seen):
    assert seen["empty"][0] == status.NO_RUN and "no run here" in seen["empty"][1]
    assert seen["missing"][0] == status.NO_RUN and "no such output folder" in seen["missing"][1]


def test_a_running_job_is_0_with_its_step(seen):
    code, line = seen["running"]
    assert code == status.HEALTHY, line
    assert "training, step " in line and "of 60; last sign of life" in line


def test_a_job_that_does_not_step_is_stalled_after_the_limit(seen):
    code, line = seen["frozen"]
    assert code == status.STALLED, line
    assert "stalled: training, step" in line and "no step, upload or event for" in line
    assert seen["frozen, a longer limit"][0] == status.HEALTHY  # the default, 1800 s, is not yet reached


def test_a_stopped_job_is_2_with_its_exit_code_and_a_finished_one_0(seen):
    assert seen["stopped exit"][0] == 143, seen["stopped exit"][1]
    code, line = seen["stopped"]
    assert code == status.ENDED_NOT_DONE and "exit code 143 (stopped by SIGTERM/SIGINT" in line, line
    assert seen["again exit"][0] == 0, seen["again exit"][1]
    assert seen["done"] == (status.HEALTHY, f"{seen['done'][1].split(':')[0]}: done (done, exit code 0)")


def test_before_training_the_controllers_heartbeat_is_its_sign_of_life(tmp_path):
    """The phases before training write few events (a model's download, the data step): the pulse is what moves."""
    from sft.controller.heartbeat import PULSE_FILE, Pulse
    from sft.events import EVENTS_FILE, EventLog, SettingsResolved

    run = tmp_path / "run"
    run.mkdir()
    EventLog(run / EVENTS_FILE).emit(SettingsResolved(settings={}))
    past = time.time() - 100
    os.utime(run / EVENTS_FILE, (past, past))
    assert status.check(tmp_path, 50)[0] == status.STALLED
    with Pulse(run, every_s=0.1):
        time.sleep(0.3)
        assert (run / PULSE_FILE).stat().st_mtime > past + 90
        code, line = status.check(tmp_path, 50)
    assert code == status.HEALTHY and line.startswith(f"{tmp_path}: starting; last sign of life"), line
