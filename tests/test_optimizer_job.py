"""The job with 8-bit AdamW state (SFT_OPTIMIZER=adamw-8bit: bitsandbytes' AdamW under ZeRO-2) end to end on two CPU
ranks through the real launcher: the decision names it, a kill -9 after a checkpoint resumes with the uninterrupted
run's losses (the checkpoint records the option, so the resume keeps the optimizer whose state it holds), and the
final model is exported. The 8-bit step against DeepSpeed's own: tests/test_patches.py."""

from __future__ import annotations

import pytest

from conftest import demo_env, read_summary, run_entrypoint, step_losses
from test_job import killed_at

pytestmark = pytest.mark.slow
pytest.importorskip("bitsandbytes")

JOB = dict(optimizer="adamw-8bit", probe_steps=0, max_steps=12, save_steps=6, logging_steps=1, learning_rate=2e-3,
           precision="fp32", seed=0, packing="false")


def test_killed_job_with_8bit_state_resumes_with_the_same_losses(tmp_path):
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    reference = run_entrypoint(demo_env(reference_dir, **JOB))
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    summary = read_summary(reference_dir / "out")
    assert summary["stage"] == "2-8bit"
    assert summary["decisions"]["optimizer"].startswith("8-bit AdamW (adamw_bnb_8bit: bitsandbytes")
    assert (reference_dir / "out" / "final" / "model.safetensors").exists()

    env = demo_env(killed_dir, **JOB)
    killed_dir.mkdir()
    killed_at(env, killed_dir / "out" / "checkpoint-6", killed_dir / "job.log")
    again = run_entrypoint(env)
    assert again.returncode == 0, again.stdout[-3000:]
    resumed = read_summary(killed_dir / "out")
    start = int(resumed["resumed_from"].rsplit("-", 1)[1])
    assert start >= 6 and resumed["stage"] == "2-8bit"
    losses, expected = step_losses(resumed), step_losses(summary)
    after = [k for k in expected if k > start]
    assert after and max(abs(losses[k] - expected[k]) for k in after) < 1e-4
