"""One job per output folder: the lock a second job finds (exit 11 at once), and a dead holder's lock taken
over with a message. Two nodes sharing a folder: tests/test_nodes.py."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from conftest import REPO, demo_env, read_summary, run_entrypoint
from sft import exitcodes
from sft.controller import outlock
from sft.data import cache

HOLD = ("import sys, time; from pathlib import Path; from sft.controller import outlock; "
        "outlock.take(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)")


def holder(out) -> subprocess.Popen:
    """Another process holding the folder's lock (as a running job's controller does), once it says so."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_and_a_released_lock_is_free(tmp_path, capsys):
    out = tmp_path / "out"
    with outlock.take(out):
        with pytest.raises(outlock.Busy) as e:
            outlock.take(out)  # another descriptor: flock refuses it even in this process
        assert str(e.value).startswith(f"another job is running on {out} (pid ")
        assert "wait for it to end, stop it, or give this one another SFT_OUTPUT_DIR" in str(e.value)
        assert (out / "run" / outlock.NAME).read_text().startswith("pid ")
    assert (out / "run" / outlock.NAME).read_text() == ""  # released cleanly: no note left
    with outlock.take(out):
        pass
    assert "ended without releasing it" not in capsys.readouterr().out


def test_a_killed_holders_lock_is_taken_over_with_a_message(tmp_path, capsys):
    out = tmp_path / "out"
    proc = holder(out)
    with pytest.raises(outlock.Busy, match=f"pid {proc.pid} on "):
        outlock.take(out)
    proc.send_signal(signal.SIGKILL)  # no handler runs: the kernel drops the lock with the process
    proc.wait()
    with outlock.take(out):
        said = capsys.readouterr().out
    assert f"warning: the job that held {out} (pid {proc.pid} on " in said
    assert "ended without releasing it (killed, or its machine died); its lock died with it, so this start takes " \
           "the folder over" in said


def test_a_job_on_a_held_folder_exits_11_at_once_and_writes_nothing(tmp_path):
    """Before: two jobs on one folder both trained and both wrote checkpoints and final/ into it."""
    out = tmp_path / "out"
    proc = holder(out)
    try:
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        result = run_entrypoint(demo_env(tmp_path, probe_steps=0, max_steps=2))
        assert result.returncode == exitcodes.OUTPUT_BUSY == 11, result.stdout[-2000:] + result.stderr[-2000:]
        assert f"error: another job is running on {out} (pid {proc.pid} on " in result.stdout
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # not even a summary
        assert "$ " not in result.stdout  # no launcher started
    finally:
        proc.kill()
        proc.wait()


def test_the_job_leaves_with_its_exit_code_and_its_exit_handlers_run(tmp_path):
    """The job leaves without the interpreter's teardown (sft/lifeline.py::leave): its code is the job's, and the
    data step's private folder (data/cache.py, removed by an exit handler) is gone once it has left."""
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    proc = holder(out)
    try:
        result = run_entrypoint({**demo_env(tmp_path, probe_steps=0, max_steps=2), "TMPDIR": str(scratch)})
        assert result.returncode == exitcodes.OUTPUT_BUSY, result.stdout[-2000:] + result.stderr[-2000:]
        assert "data: SFT_DATASET: " in result.stdout  # the data was read (into the private folder) before the lock
        assert list(scratch.glob(f"{cache.STAGING}*")) == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_job_takes_over_a_dead_jobs_folder_and_trains(tmp_path):
    out = tmp_path / "out"
    proc = holder(out)
    proc.kill()
    proc.wait()
    result = run_entrypoint(demo_env(tmp_path, probe_steps=0, max_steps=2, save_steps=2))
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"warning: the job that held {out} (pid {proc.pid} on " in result.stdout
    assert read_summary(out)["status"] == "done"
    assert (out / "run" / outlock.NAME).read_text() == ""  # released at the end
