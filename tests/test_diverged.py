"""A loss that is not finite stops the ranks with a message that says so, and nothing diverged is saved.

The Trainer's default (logging_nan_inf_filter) logs a NaN step as the mean of the others, 0.0 when it logs every
step: on an H200 the compiled defaults trained 12 NaN steps that read as a loss of 0.0, and the probe called it a
success (docs/speed.md). Here the NaN is real: a model whose final norm holds a NaN weight, as a corrupted
download or a broken conversion leaves one, trained by the real entrypoint on 2 CPU ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from conftest import DEMO_MODEL, REPO, clean_environ, demo_env, read_summary, run_entrypoint
from sft.nodes import free_port


@pytest.fixture
def broken_model(tmp_path: Path) -> Path:
    folder = tmp_path / "broken-model"
    shutil.copytree(DEMO_MODEL, folder)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("model.norm.weight"))
    weights[name][0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_probe_whose_loss_is_nan_fails_naming_it(tmp_path, broken_model):
    env = demo_env(tmp_path, model=broken_model, probe_steps=4, cpu_ranks=2)
    done = run_entrypoint(env, "probe")
    assert done.returncode == 5, done.stdout[-3000:] + done.stderr[-3000:]
    error = next(line for line in done.stdout.splitlines() if " error: the probe failed" in line)
    assert "LossNotFinite: loss nan at step 1: training diverged" in error
    assert "SFT_LEARNING_RATE" in error and "SFT_COMPILE=false" in error
    assert read_summary(tmp_path / "out")["status"] != "done"


def test_training_that_diverges_saves_no_checkpoint_of_it(tmp_path, broken_model):
    # no probe, a save every step: step 1 is logged (the job's logging_first_step), so its log stops the run
    env = demo_env(tmp_path, model=broken_model, probe_steps=0, save_steps=1, max_steps=3, cpu_ranks=2)
    done = run_entrypoint(env)
    assert done.returncode == 6, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert "loss nan at step 1: training diverged" in done.stdout
    assert not list(out.glob("checkpoint-*")) and not (out / "final").exists()


def test_the_finite_case_is_not_flagged():
    from sft.ranks.progress import not_finite

    assert not_finite({"loss": 2.5, "grad_norm": 0.8}, 3) is None
    assert not_finite({"loss": 2.5, "grad_norm": float("inf")}, 3, step_applied=False) is None  # skipped
    assert "loss inf at step 3" in str(not_finite({"loss": float("inf")}, 3))
    assert "grad_norm nan at step 7" in str(not_finite({"loss": 1.0, "grad_norm": float("nan")}, 7))


def _callback(trainer):
    from sft.ranks.progress import ProgressCallback

    callback = ProgressCallback.__new__(ProgressCallback)
    callback.trainer = trainer
    return callback


def test_a_save_at_a_step_not_logged_is_refused_once_the_running_loss_is_nan():
    """Logged every 10 steps and saved every 5, a NaN at step 3 would reach checkpoint-5 before any log shows
    it: the save's own check reads the Trainer's running loss sum, which holds the NaN (logging_nan_inf_filter
    is off). Single process: no collective."""
    from types import SimpleNamespace

    import torch

    from sft.ranks.progress import LossNotFinite

    def check(running: float) -> None:
        _callback(SimpleNamespace(_tr_loss=torch.tensor(running)))._refuse_to_save_diverged(
            SimpleNamespace(global_step=5))

    check(12.5)
    with pytest.raises(LossNotFinite, match="loss nan at step 5: training diverged"):
        check(float("nan"))


def test_an_infinite_gradient_norm_of_an_applied_step_stops_and_of_a_skipped_one_does_not():
    """DeepSpeed reports a NaN or infinite gradient as an infinite norm (older helpers: -1). A step its overflow
    check skipped left the weights as they were; one it applied (bf16's check off, sft/stages.py) did not."""
    from types import SimpleNamespace

    import torch

    from sft.ranks.progress import LossNotFinite, not_finite

    for norm in (float("inf"), -1.0):
        assert f"grad_norm {norm} (a NaN or infinite gradient, applied to the weights) at step 4: training " \
            "diverged" in str(not_finite({"loss": 2.0, "grad_norm": norm}, 4))
        assert not_finite({"loss": 2.0, "grad_norm": norm}, 4, step_applied=False) is None
    engine = SimpleNamespace(get_global_grad_norm=lambda: torch.tensor(float("inf")), was_step_applied=lambda: True)
    callback = _callback(SimpleNamespace(_tr_loss=torch.tensor(3.0), model_wrapped=engine))
    with pytest.raises(LossNotFinite, match=r"grad_norm inf \(a NaN or infinite gradient, applied to the weights\)"):
        callback._refuse_to_save_diverged(SimpleNamespace(global_step=5))
    engine.was_step_applied = lambda: False
    callback._refuse_to_save_diverged(SimpleNamespace(global_step=5))
    engine.get_global_grad_norm, engine.was_step_applied = (lambda: 0.7), (lambda: True)
    callback._refuse_to_save_diverged(SimpleNamespace(global_step=5))


@pytest.mark.parametrize("config", ["shipped", "check"])
def test_a_nan_gradient_through_real_deepspeed(config, tmp_path):
    """Real DeepSpeed ZeRO-2 in bf16 on CPU, one step whose gradient holds a NaN while its loss is finite. With
    the job's shipped config (overflow check off) DeepSpeed applies it, the weights hold NaN and its norm reads
    inf: the ranks' checks stop there, at a log and before a save. With the check on the step is skipped, the
    weights stay finite, and nothing stops."""
    import json
    import subprocess
    import sys

    port = free_port()
    # as a module from the repository root, so the script imports sft (pytest's pythonpath is not a child's)
    done = subprocess.run([sys.executable, "-m", "tests.nan_gradient_step", config, str(port)],
                          env=clean_environ(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["grad_norm"] == float("inf") and result["loss"] < 10
    if config == "shipped":
        assert result["applied"] and result["weights_nan"]
        assert result["at_save"].startswith("LossNotFinite: grad_norm inf (a NaN or infinite gradient, applied to "
                                            "the weights) at step 2: training diverged")
        assert "grad_norm inf (a NaN or infinite gradient, applied" in result["at_log"]
    else:
        assert not result["applied"] and not result["weights_nan"]
        assert result["at_save"] is None and result["at_log"] is None


def test_the_check_runs_before_every_save():
    """The Trainer decides a save in on_step_end (its flow callback runs first); the job's callback then refuses
    it when the running loss holds a NaN, before the Trainer writes anything."""
    from types import SimpleNamespace

    import torch
    from transformers import TrainerControl

    from sft.events import Progress
    from sft.ranks.cadence import SaveClock
    from sft.ranks.progress import LossNotFinite, ProgressCallback

    callback = ProgressCallback.__new__(ProgressCallback)
    callback.trainer = SimpleNamespace(_tr_loss=torch.tensor(float("nan")), _total_train_tokens=0)
    callback.report = SimpleNamespace(steps=[], first_step_wall=None, eval_seconds=0.0, held_seconds=0.0)
    callback.hold = None  # a training launch that is not also the probe
    callback.stop = SimpleNamespace(agree=lambda lagged=False, save_due=False: (False, False))
    callback.clock = SaveClock()  # by the Trainer's steps: it decided the save below
    callback.progress = Progress()  # no rate yet
    callback._write_progress = lambda *a, **k: None  # the progress file: not what is tested here
    state = SimpleNamespace(global_step=5, is_world_process_zero=False)
    callback.on_step_end(SimpleNamespace(save_strategy="steps"), state, TrainerControl())  # no save: no check
    with pytest.raises(LossNotFinite, match="loss nan at step 5"):
        callback.on_step_end(SimpleNamespace(save_strategy="steps"), state, TrainerControl(should_save=True))
