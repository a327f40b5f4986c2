"""The step's numbers read without waiting for the GPU's queue (sft/ranks/patches/reads.py) are the numbers TRL and the
Trainer log themselves: the demo job on two CPU ranks, once with the Reads and once with their own `.item()`s
(SFTDEV_OWN_READS=1), every logged value compared, over a whole epoch whose last batch is short on one rank
(where TRL's gather_for_metrics leaves that rank's copies out)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import demo_env, read_summary, run_entrypoint

JOB = dict(max_length=128, micro_batch=1, grad_accum=1, probe_steps=0, logging_steps=1, save_steps=1000,
           learning_rate=2e-3, seed=0)


def _logged(tmp_path, name: str, **extra: str) -> tuple[list[dict], dict]:
    env = {**demo_env(tmp_path / name, **JOB), **extra}
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / name / "out" / "run" / "reports" / "train-rank0.json").read_text())
    own = "the step's numbers read by .item()" in result.stdout + result.stderr  # SFTDEV_OWN_READS reached them
    assert own == ("SFTDEV_OWN_READS" in extra), name
    return report["log_history"], read_summary(tmp_path / name / "out")


@pytest.mark.timeout(900)
def test_the_reads_log_what_trl_and_the_trainer_log(tmp_path):
    ours, summary = _logged(tmp_path, "reads")
    theirs, _ = _logged(tmp_path, "own", SFTDEV_OWN_READS="1")
    assert summary["resolved"]["ranks"] == 2
    assert [e["step"] for e in ours] == [e["step"] for e in theirs] and len(ours) > 50
    compared = 0
    for a, b in zip(ours, theirs):
        assert set(a) == set(b), a["step"]
        for key in a:
            if key in ("train_runtime", "train_samples_per_second", "train_steps_per_second"):
                continue  # the clock
            # fp64 sums of the same numbers TRL adds in fp32: equal to float32's precision
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-7), (a["step"], key, a[key], b[key])
            compared += 1
    assert {"loss", "grad_norm", "num_tokens", "entropy", "mean_token_accuracy"} <= set(ours[-2])
    assert {"total_flos", "train_loss"} <= set(ours[-1])
    assert compared > 400
