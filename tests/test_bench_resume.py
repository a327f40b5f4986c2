"""scripts/bench_resume.py on the demo: a run stopped by SIGTERM, resumed from its disk and from the local Hub, each
start's seconds to its first step printed (issue 42: what a resume costs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def test_bench_resume_prints_each_starts_time_to_its_first_step(tmp_path):
    work = tmp_path / "work"
    # Slower steps (sft/dev/faults.py), so the stop lands mid-run on any machine: the demo's 91 steps train in about
    # 2 s, and rank 0 records its step every 2 s; at 0.1 s a step the run has 9 s of steps.
    env = {**os.environ, "SFTTEST_STEP_SECONDS": "0.1"}
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_resume.py"), "--work", str(work), "--json",
                             str(tmp_path / "resume.json"), "--stop-at", "15"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first, disk, hub = json.loads((tmp_path / "resume.json").read_text())["runs"]
    assert first["stopped_at"] >= 15 and first["launch_to_step"] > 0
    for row in (disk, hub):
        assert row["launch_to_first_step"] > 0
        assert f"{row['name']:<34} launch to first step" in result.stdout
    # the Hub's start downloaded the stop's checkpoint (the job's own line: its size, seconds and rate)
    assert hub["checkpoint"] == f"checkpoint-{first['stopped_at']}" and hub["download_seconds"] >= 0
    assert "download_seconds" not in disk
    assert (work / "out" / f"checkpoint-{first['stopped_at']}").is_dir()
