"""A torch extension build lock that a killed process left: found, told apart from a live build's, and removed by
the job before its ranks start, which would otherwise wait on it forever (a CI run's demo hung 89 minutes on one)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import demo_env, run_entrypoint

from sft.controller import buildlocks, preflight

# torch's own lock, taken as cpp_extension.load takes it, then the process waits to be killed
HOLD = """
import sys, time
from torch.utils.file_baton import FileBaton
assert FileBaton(sys.argv[1]).try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold(lock: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_lock_is_stale_only_once_the_process_holding_it_is_killed(tmp_path):
    (tmp_path / "cpu_adam").mkdir()
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    holder = hold(lock)
    try:
        assert buildlocks.stale(tmp_path) == ()  # a build in progress: its lock is kept
        assert buildlocks.remove((str(lock),)) == [] and lock.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists()  # kill -9 ran no `finally`: the lock every later load would wait on
    assert buildlocks.stale(tmp_path) == (str(lock),)
    assert buildlocks.remove((str(lock),)) == [str(lock)] and not lock.exists()
    assert buildlocks.stale(tmp_path) == () and buildlocks.remove((str(lock),)) == []  # once


def test_preflight_names_the_stale_locks_and_what_the_job_does():
    assert preflight.check_build_locks(()).status == "ok"
    found = preflight.check_build_locks(("/root/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock",))
    assert found.status == "info" and "deepspeed_shm_comm/lock" in found.message
    assert "removes them before its ranks start" in found.message


@pytest.mark.slow
def test_the_job_removes_a_killed_builds_lock_and_trains_where_it_hung_before(tmp_path):
    """The demo's job with the lock of DeepSpeed's shared-memory all-reduce (which CPU ranks load at every start)
    left by a killed process: before the fix the ranks waited on it forever after 'standby: rank 0 imported'."""
    ext = tmp_path / "torch-extensions"
    built = buildlocks.extensions_root() / "deepspeed_shm_comm"  # built by an earlier job: copied, not built again
    if (built / "deepspeed_shm_comm.so").exists():
        shutil.copytree(built, ext / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock"))
    lock = ext / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = hold(lock)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    env = demo_env(tmp_path, max_steps=4, probe_steps=0, save_steps=4, max_length=128, micro_batch=1, grad_accum=1)
    env["TORCH_EXTENSIONS_DIR"] = str(ext)
    began = time.monotonic()
    done = run_entrypoint(env, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"removed {lock}: a torch extension build lock that a killed build left" in done.stdout
    assert "[info] build_locks  1 torch extension build lock(s) left by a killed build" in done.stdout
    assert (tmp_path / "out" / "final" / "config.json").is_file() and not lock.exists()
    print(f"the job with a stale lock: {time.monotonic() - began:.1f} s")
