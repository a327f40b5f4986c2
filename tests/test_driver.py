"""The NVIDIA driver against the CUDA torch was built for (preflight.check_driver): a driver too old for the image's
CUDA stops the job with exit 3 before any rank starts, naming the driver, the CUDA it needs, the image that runs on it
and NVIDIA's forward compatibility package.

On CPU: nvidia-smi is a script on PATH that answers as a host's driver does, and SFTTEST_TORCH_CUDA stands in for
the CUDA build of torch this machine does not have (machine.torch_cuda)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import demo_env, run_entrypoint

from sft import exitcodes
from sft.controller import machine
from sft.controller.preflight import CUDA_LINES, FAIL, INFO, MIN_DRIVER, OK, WARN, check_driver
from sft.planner.inputs import GPU

H100 = "NVIDIA H100 80GB HBM3"


# --- The check, as a function of what was measured


def test_a_cpu_build_of_torch_needs_no_driver():
    assert check_driver(None, None, (), 0).status == INFO


def test_gpus_torch_sees_mean_the_driver_runs_its_cuda():
    found = check_driver("13.0", None, (), 8)
    assert found.status == OK and "CUDA 13.0" in found.message


def test_no_nvidia_smi_is_cpu_ranks():
    found = check_driver("13.0", None, (), 0)
    assert found.status == INFO and "--gpus all" in found.message


def test_a_535_driver_under_cuda_13_names_the_12_6_release_tag_and_forward_compatibility():
    found = check_driver("13.0", "535.104.05", (H100,) * 8, 0, version="v1.2.3")
    assert found.status == FAIL
    for part in ("535.104.05", "CUDA 13.0", "580 or newer", "tag 1.2.3-cuda12.6", "cuda-compat-13-0",
                 "LD_LIBRARY_PATH=/usr/local/cuda-13.0/compat", "forward-compatibility"):
        assert part in found.message, (part, found.message)
    assert found.data["needs"] == 580


def test_a_build_that_is_not_a_release_says_how_to_build_the_other_line():
    found = check_driver("13.0", "570.86.10", (H100,), 0, version="4e43bf4-dirty")
    assert found.status == FAIL and "`make image CUDA_LINE=12.6`" in found.message and "tag" not in found.message


def test_geforce_cards_are_not_offered_forward_compatibility():
    found = check_driver("13.0", "560.35.03", ("NVIDIA GeForce RTX 4090",), 0, version="1.2.3")
    assert found.status == FAIL and "1.2.3-cuda12.6" in found.message and "cuda-compat" not in found.message


def test_a_driver_older_than_every_line_asks_for_an_upgrade():
    found = check_driver("12.6", "470.256.02", (H100,), 0, version="1.2.3")
    assert found.status == FAIL and "525 or newer" in found.message
    assert "-cuda13.0" not in found.message and "cuda-compat-12-6" in found.message


def test_a_new_enough_driver_whose_gpus_torch_cannot_see_is_a_warning():
    found = check_driver("13.0", "580.65.06", (H100,), 0)
    assert found.status == WARN and "CUDA_VISIBLE_DEVICES" in found.message


def test_every_line_has_its_minimum_driver():
    assert {line.split(".")[0] for line in CUDA_LINES} <= MIN_DRIVER.keys()


# --- As measured: nvidia-smi on PATH, and the job's own start


def _nvidia_smi(folder: Path, driver: str, names: tuple[str, ...]) -> dict[str, str]:
    """A folder with an nvidia-smi that answers the driver check's query as a host's does; PATH with it first."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = "\\n".join(f"{driver}, {name}" for name in names)
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$*" = "--query-gpu=driver_version,name --format=csv,noheader" ] || exit 9\n'
                      f'printf "{rows}\\n"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_nvidia_smi_is_read_for_the_driver_and_the_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _nvidia_smi(tmp_path / "bin", "535.104.05", (H100, H100))["PATH"])
    assert machine.nvidia_driver() == ("535.104.05", (H100, H100))
    monkeypatch.setenv("SFTTEST_TORCH_CUDA", "13.0")
    assert machine.driver_facts(()) == ("13.0", "535.104.05", (H100, H100))
    assert machine.driver_facts((GPU(H100, 80 * 2**30),)) == ("13.0", None, ())  # torch sees them: not read


def test_no_nvidia_smi_reads_as_no_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine.nvidia_driver() == (None, ())


@pytest.mark.parametrize("command", ["run", "probe"])
def test_the_job_stops_with_exit_3_before_any_rank_on_a_driver_too_old(tmp_path, command):
    env = demo_env(tmp_path, max_length=128)
    env.update(_nvidia_smi(tmp_path / "bin", "535.104.05", (H100,) * 2), SFTTEST_TORCH_CUDA="13.0")
    result = run_entrypoint(env, command, timeout=300)
    assert result.returncode == exitcodes.PREFLIGHT, result.stdout + result.stderr
    assert "NVIDIA driver 535.104.05 is too old" in result.stderr and "580 or newer" in result.stderr
    assert "CUDA 12.6 line" in result.stderr and "cuda-compat-13-0" in result.stderr
    # nothing started: no output folder (the lock, the settings, the events, the ranks' reports are all under it)
    assert not (tmp_path / "out").exists(), sorted(p.name for p in (tmp_path / "out").iterdir())


def test_doctor_shows_the_driver_check(tmp_path):
    env = demo_env(tmp_path)
    env.update(_nvidia_smi(tmp_path / "bin", "535.104.05", (H100,)), SFTTEST_TORCH_CUDA="13.0")
    result = run_entrypoint(env, "doctor", timeout=300)
    assert result.returncode == exitcodes.PREFLIGHT, result.stdout + result.stderr
    assert "[fail] driver" in result.stdout and "535.104.05" in result.stdout
    env.update(_nvidia_smi(tmp_path / "new", "580.65.06", (H100,)))
    result = run_entrypoint(env, "doctor", timeout=300)
    assert "[warn] driver" in result.stdout and "yet torch sees none" in result.stdout, result.stdout
