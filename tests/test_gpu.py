"""On a GPU: the job in bf16 with the real NCCL path, and the planner never under the measured peak.
Skipped, with the reason, on machines with no CUDA GPU (CI); run on the GPU machine with
`python -m pytest tests/test_gpu.py -m gpu`."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import demo_env, read_summary, run_entrypoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("stage", ["2", "3"])
def test_job_on_the_gpu_in_bf16(tmp_path, stage):
    result = run_entrypoint(demo_env(tmp_path, zero_stage=stage, probe_steps=5, max_steps=10, save_steps=5,
                                     max_length=128, learning_rate=2e-3))
    assert result.returncode == 0, result.stdout[-3000:]
    summary = read_summary(tmp_path / "out")
    assert summary["resolved"]["attention"] == "flex_attention" and summary["resolved"]["precision"] == "auto"
    probe = json.loads((tmp_path / "out" / "run" / "probe.json").read_text())
    assert probe["device"].startswith("NVIDIA") and all(g > 0 for g in probe["peak_reserved_gib"])
    predicted = next(o["peak"] for o in summary["plan"]["options"] if o["option"] == stage)
    assert max(probe["peak_reserved_gib"]) <= predicted  # an under-prediction is a user's OOM


def test_sft_gpus_naming_a_gpu_that_is_not_there_is_reported_with_the_other_problems(tmp_path):
    """SFT_GPUS is checked against the GPUs there are with the settings, all problems at once, exit 2, nothing
    written (before: a parse error hid it, and it was found only after the settings were accepted)."""
    count = torch.cuda.device_count()
    result = run_entrypoint(demo_env(tmp_path, gpus=f"0,{count}", micro_batch=0))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert problems == ["  - SFT_MICRO_BATCH='0': expected at least 1",
                        f"  - SFT_GPUS='0,{count}': this machine shows {count} GPU(s) (0-{count - 1}); no GPU {count}"]
    assert not (tmp_path / "out").exists()
