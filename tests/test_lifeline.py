"""How the job's processes leave (sft/lifeline.py): `leave` skips the interpreter's teardown, never what Python's own
exit waits for. The job's exit through it, end to end: tests/test_outlock.py (a refusal) and tests/test_job.py (a
run, its summary and loss plot written)."""

from __future__ import annotations

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
