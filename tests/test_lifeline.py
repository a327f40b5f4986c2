"""How the job's processes leave (sft/lifeline.py): `leave` skips the interpreter's teardown, never what Python's own
exit waits for; the controller and the launcher leave through it. The job's exit through it, end to end:
tests/test_outlock.py (a refusal) and tests/test_job.py (a run, its summary and loss plot written)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

LEAVES = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from sft.lifeline import leave

out = Path(sys.argv[1])
pool = ThreadPoolExecutor(1)  # never shut down: Python's exit does it, and so must leave
pool.submit(time.sleep, 0.2)
threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("joined"))).start()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("buffered, no newline")
leave(int(sys.argv[2]))
"""


def test_leave_keeps_the_code_joins_the_threads_and_runs_the_exit_handlers(tmp_path):
    """What an exit handler does (the data step's private folder removed) and what a non-daemon thread writes are
    not lost, and neither is the exit code nor what stdout still buffered."""
    for code in (0, 7, 143):
        done = subprocess.run([sys.executable, "-c", LEAVES, str(tmp_path), str(code)], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == code, done.stderr
        assert done.stdout == "buffered, no newline"
        assert (tmp_path / "thread").read_text() == "joined" and (tmp_path / "atexit").read_text() == "ran"
        for made in ("thread", "atexit"):
            (tmp_path / made).unlink()


PROGRAM = """
import sys
from pathlib import Path

Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]) + " " + __name__)
if sys.argv[2] == "fail":
    raise ValueError("the launcher's own failure")
if sys.argv[2] != "ok":
    sys.exit(int(sys.argv[2]))
"""


def test_the_launcher_runs_in_its_shim_with_its_arguments_and_its_exit(tmp_path):
    """The shim that binds the launcher to the controller (sft/controller/launch.py) runs `python -m LAUNCHER ...` in
    its own process and leaves it with the launcher's code; an exception is Python's own exit 1, with its traceback."""
    (tmp_path / "fake_launcher.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    seen = tmp_path / "seen"
    for given, code in (("ok", 0), ("75", 75), ("fail", 1)):
        done = subprocess.run([sys.executable, "-m", "sft.controller.launch", str(os.getpid()), sys.executable, "-m",
                               "fake_launcher", str(seen), given, "--flag"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == code, done.stderr
        assert seen.read_text() == f"{given} --flag __main__"
        assert ("ValueError: the launcher's own failure" in done.stderr) == (given == "fail")
