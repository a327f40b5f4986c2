"""The whole job end to end: entrypoint.py as a subprocess, configured only by environment variables,
two ranks on gloo through the real launcher, real DeepSpeed ZeRO, on the demo model and data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, demo_env, read_summary, run_entrypoint, step_losses, tmpfs
from sft import checkpoints, exitcodes
from sft.checkpoints import folder_bytes
from sft.planner import disk

pytestmark = pytest.mark.slow

STAGES = ["1", "2", "3", "3-offload"]
DEEPSPEED_LAUNCHER_STAGE = "1"  # this stage's run is started by DeepSpeed's launcher, the others by torchrun
# One full epoch of the demo: 512 conversations / (2 ranks x micro-batch 1 x accumulation 4) = 64 steps.
EPOCH_STEPS = 64
JOB = dict(probe_steps=5, save_steps=20, save_total_limit=2, logging_steps=1, learning_rate=2e-3,
           precision="fp32", seed=0, packing="false")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """One full job per stage, shared by the tests below (each takes about a minute on 2 cores)."""
    done = {}
    for stage in STAGES:
        tmp = tmp_path_factory.mktemp(f"zero{stage}")
        # ZeRO-1's run goes through SFT_LAUNCHER=deepspeed, the seed's first launcher: its own job cost CI a
        # minute, and the losses of every stage must agree whichever launcher started the ranks
        launcher = dict(launcher="deepspeed") if stage == DEEPSPEED_LAUNCHER_STAGE else {}
        result = run_entrypoint(demo_env(tmp, zero_stage=stage, **JOB, **launcher))
        done[stage] = (result, tmp / "out")
    return done


@pytest.mark.parametrize("stage", STAGES)
def test_probe_then_full_epoch(runs, stage):
    result, out = runs[stage]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    probe = json.loads((out / "run" / "probe.json").read_text())
    assert probe["steps"] == 5 and probe["world_size"] == 2 and len(probe["peak_reserved_gib"]) == 2
    assert probe["tokens_per_second"] > 0 and probe["steps_per_epoch"] == EPOCH_STEPS
    assert probe["total_steps"] == EPOCH_STEPS and probe["projected_hours"] >= 0
    # where the start went: to the ranks' training loop, then the first step (equal where the first step is
    # shorter than their rounding, 0.1 s)
    assert 0 < probe["seconds_to_training_loop"] <= probe["seconds_to_first_step"]
    assert "of which to the ranks' training loop" in result.stdout
    summary = read_summary(out)
    assert summary["status"] == "done" and summary["stage"] == stage
    assert summary["train"]["global_step"] == EPOCH_STEPS
    assert (out / "run" / "loss.png").stat().st_size > 0
    # the probe as a predictor: its figure against the run's own steady state, both recorded
    check = summary["probe_check"]
    assert check["probe_tokens_per_second"] == probe["tokens_per_second"]
    assert check["run_steady_tokens_per_second"] == summary["train"]["steady_tokens_per_second"] > 0
    ratio = probe["tokens_per_second"] / check["run_steady_tokens_per_second"]
    assert check["tokens_per_second_error"] == round(ratio - 1, 4)
    assert "probe check: the probe measured" in result.stdout


@pytest.mark.parametrize("stage", STAGES)
def test_loss_goes_down(runs, stage):
    losses = list(step_losses(read_summary(runs[stage][1])).values())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)


@pytest.mark.parametrize("stage", STAGES)
def test_only_the_newest_checkpoints_remain(runs, stage):
    out = runs[stage][1]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-60", "checkpoint-64"]
    # the probe writes no checkpoint
    assert not list((out / "run" / "probe").glob("checkpoint-*"))


@pytest.mark.parametrize("stage", STAGES)
def test_final_model_is_the_trained_weights(runs, stage, tmp_path):
    """final/ reloads with transformers and gives the logits of the last checkpoint's fp32 weights."""
    from transformers import AutoModelForCausalLM

    out = runs[stage][1]
    exported = tmp_path / "fp32"
    result = run_entrypoint(demo_env(tmp_path), "export", str(out / "checkpoint-64"), str(exported))
    assert result.returncode == 0, result.stderr[-3000:]
    final = AutoModelForCausalLM.from_pretrained(out / "final").eval()
    reference = AutoModelForCausalLM.from_pretrained(exported).eval()
    initial = AutoModelForCausalLM.from_pretrained(REPO / "demo" / "tiny-qwen3").eval()
    ids = torch.randint(0, final.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want, before = final(ids).logits, reference(ids).logits, initial(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, before, atol=1e-3)  # it did train


@pytest.mark.parametrize("stage", STAGES)
def test_the_final_model_is_the_end_checkpoints_model_files_linked_not_written_again(runs, stage, tmp_path):
    """final/ is the end's checkpoint's files for the model (ranks/final.py): each the same file on the disk (a hard
    link), and by name what save_model writes: the model's and the tokenizer's save_pretrained, and training_args.bin.
    Before, save_model wrote the weights a second time while the GPU waited."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result, out = runs[stage]
    final, last = out / "final", out / "checkpoint-64"
    assert "final model: " in result.stdout and "the model files of checkpoint-64 (hard links" in result.stdout
    for path in final.iterdir():
        assert path.stat().st_ino == (last / path.name).stat().st_ino, path.name
    AutoModelForCausalLM.from_pretrained(final).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(final).save_pretrained(tmp_path)
    assert sorted(p.name for p in final.iterdir()) == sorted([p.name for p in tmp_path.iterdir()] + ["training_args.bin"])


def test_with_the_best_checkpoint_loaded_at_the_end_final_is_that_checkpoints_weights(tmp_path):
    """load_best_model_at_end (SFT_TRAINER_ARGS): the Trainer loads the best checkpoint at the end, so final/ is
    save_model's of those weights, not links to the last checkpoint's files. The best by the highest eval loss is the
    first checkpoint: the loss goes down."""
    from safetensors.torch import load_file

    best = dict(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True)
    env = demo_env(tmp_path, **{**JOB, "probe_steps": 0, "save_steps": 10, "max_steps": 20, "eval_fraction": 0.1,
                                "trainer_args": json.dumps(best)})
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out"
    assert "hard links" not in result.stdout
    final = load_file(out / "final" / "model.safetensors")
    first, last = (load_file(out / f"checkpoint-{step}" / "model.safetensors") for step in (10, 20))
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, first[name], rtol=0, atol=0)
    assert any(not torch.equal(tensor, last[name]) for name, tensor in final.items())


@pytest.mark.parametrize("stage", ["1", "2"])
def test_a_checkpoints_weights_are_deepspeeds_and_written_as_save_pretrained_writes_them(runs, stage, tmp_path):
    """ZeRO-1/2's weights reach a checkpoint without a copy to the host first (ranks/patches/checkpoints.py): the
    Trainer's model.safetensors holds DeepSpeed's module weights, one tensor per weight as save_pretrained writes
    the model outside DeepSpeed (the tied LM head once, not a second copy), and DeepSpeed's file loads as before."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folder = runs[stage][1] / "checkpoint-64"
    weights = load_file(folder / "model.safetensors")
    module = torch.load(folder / "global_step64" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, module[name], rtol=0, atol=0)
    AutoModelForCausalLM.from_pretrained(REPO / "demo" / "tiny-qwen3").save_pretrained(tmp_path)
    assert sorted(weights) == sorted(load_file(tmp_path / "model.safetensors"))


def test_stages_give_the_same_losses_in_fp32(runs):
    reference = step_losses(read_summary(runs["2"][1]))
    assert len(reference) == EPOCH_STEPS
    for stage in STAGES:
        losses = step_losses(read_summary(runs[stage][1]))
        assert losses.keys() == reference.keys()
        worst = max(abs(losses[k] - reference[k]) for k in reference)
        assert worst < 1e-4, f"ZeRO {stage} differs from ZeRO-2 by {worst}"


def test_second_start_of_a_finished_job_does_nothing(runs, tmp_path):
    _, out = runs["2"]
    before = {p: p.stat().st_mtime for p in out.rglob("*") if p.is_file()}
    env = demo_env(tmp_path, zero_stage="2", **JOB)
    env["SFT_OUTPUT_DIR"] = str(out)
    result = run_entrypoint(env)
    assert result.returncode == 0 and f"{out} is already trained with these settings; nothing to do." in result.stdout
    assert {p: p.stat().st_mtime for p in out.rglob("*") if p.is_file()} == before
    # Before: other settings got the same silent "already trained" and exit 0
    env.update(SFT_LEARNING_RATE="1e-4", SFT_PROBE_STEPS="0")  # the probe's steps do not change what is trained
    other = run_entrypoint(env)
    assert other.returncode == exitcodes.BAD_SETTINGS, other.stdout[-3000:]
    assert (f"error: {out} holds a finished run with other settings: SFT_LEARNING_RATE=0.0001 (the finished run: "
            "0.002). Nothing was started: to train with these settings, start a new run with another SFT_OUTPUT_DIR"
            ) in other.stdout
    assert {p: p.stat().st_mtime for p in out.rglob("*") if p.is_file()} == before


def test_the_disk_preflight_sizes_a_checkpoint_as_it_is_written(runs):
    """Before: 14 bytes/param whatever the run, about 2x under an fp32 run's checkpoint. The demo model is
    tiny, so the tokenizer, rng states and scripts each checkpoint holds add about 15% here."""
    for stage, (result, out) in runs.items():
        summary = read_summary(out)
        per_param, _ = disk.checkpoint_bytes_per_param(False, 3 if stage.startswith("3") else int(stage), "adamw")
        estimate = per_param * summary["plan"]["model"]["total_params"]
        real = folder_bytes(out / "checkpoint-64")
        assert 0.9 < real / estimate < 1.25, (stage, real, estimate)
        check = next(c for c in summary["preflight"] if c["name"] == "disk")
        assert f"({per_param:g} bytes/param: fp32 weights" in check["message"]
        assert "[rank 0] disk after checkpoint-20: a checkpoint takes" in result.stdout


def _start(env: dict[str, str], log: Path) -> subprocess.Popen:
    # Output to a file, not a pipe: an unread pipe fills up and blocks the job mid-run.
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared: " + log.read_text()[-3000:]
        time.sleep(0.05)


def killed_at(env: dict[str, str], checkpoint: Path, log: Path) -> None:
    """The job started, then killed -9 whole once `checkpoint` is complete: the VM dies, no handler runs."""
    proc = _start(env, log)
    _wait_for_complete(checkpoint, proc, log)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait_for_complete(folder: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    """Until the checkpoint is complete: its files are written in the background after the save returns."""
    _wait_for(folder / "trainer_state.json", proc, log, timeout)
    deadline = time.monotonic() + timeout
    while checkpoints.problem(folder) is not None:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def test_killed_during_a_background_write_resumes_from_the_checkpoint_before(runs, tmp_path):
    """kill -9 of the whole job (the VM dies, no handler runs) while checkpoint-40's files are still being written
    (a slow disk: each file waits 20 s before it takes its place): checkpoint-40 is torn, a new start resumes from
    checkpoint-20, the newest complete one, with the uninterrupted run's losses and token count."""
    env = demo_env(tmp_path, zero_stage="2", **JOB)
    env["SFTTEST_WRITE_SECONDS"] = "20"
    log, out = tmp_path / "job.log", tmp_path / "out"
    proc = _start(env, log)
    _wait_for(out / "checkpoint-40" / "trainer_state.json", proc, log)  # the save returned, its files not written
    assert checkpoints.problem(out / "checkpoint-40").startswith("still being written")
    assert checkpoints.problem(out / "checkpoint-20") is None  # a new save waits for the one before
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    del env["SFTTEST_WRITE_SECONDS"]
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "skipping checkpoint-40: incomplete (still being written" in result.stdout
    summary = read_summary(out)
    assert summary["resumed_from"].endswith("checkpoint-20")
    assert_follows(summary, read_summary(runs["2"][1]), 20)
    assert summary["train"]["num_tokens"] == read_summary(runs["2"][1])["train"]["num_tokens"]


def test_sigterm_during_a_background_write_waits_for_it_and_both_checkpoints_are_complete(runs, tmp_path):
    """SIGTERM (docker stop: the init forwards it to the controller) while checkpoint-20's files are being written,
    on ZeRO-3: the stop's own save waits for them, then its own are written before the job exits 143, stopped, with
    no final model; a new start resumes from the stop's checkpoint with the same losses, and keeps
    SFT_SAVE_TOTAL_LIMIT checkpoints though its last one was still being written when it rotated."""
    env = demo_env(tmp_path, zero_stage="3", **JOB)
    env["SFTTEST_WRITE_SECONDS"] = "5"
    log, out = tmp_path / "job.log", tmp_path / "out"
    proc = _start(env, log)
    _wait_for(out / "checkpoint-20" / "trainer_state.json", proc, log)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=300)
    assert proc.returncode == 143, log.read_text()[-3000:]
    stopped = read_summary(out)
    stopped_at = stopped["train"]["global_step"]
    # a stop that comes while checkpoint-20 is being closed stops at 20 (every rank checks after a save too)
    assert stopped["status"] == "stopped" and 20 <= stopped_at < EPOCH_STEPS
    assert not (out / "final").exists()
    assert checkpoints.problem(out / "checkpoint-20") is None
    assert checkpoints.problem(out / f"checkpoint-{stopped_at}") is None
    events = (out / "run" / "events.jsonl").read_text()
    assert f'"event": "checkpoint_written", "step": {stopped_at}' in events
    env["SFTTEST_WRITE_SECONDS"] = "1"  # the last checkpoint is still being written when its save rotates
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = read_summary(out)
    assert summary["resumed_from"].endswith(f"checkpoint-{stopped_at}")
    assert_follows(summary, read_summary(runs["3"][1]), stopped_at)
    # that save kept one more (the newest was not complete yet); the end of training deletes it
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-60", "checkpoint-64"]


def logged_tokens(summary: dict) -> dict[int, int]:
    return {e["step"]: e["num_tokens"] for e in summary["train"]["log_history"] if "num_tokens" in e}


def resume_with_room(env: dict[str, str], small: Path, out: Path) -> dict:
    """The other writer's file gone (room again), a new start: it resumes and trains to the end."""
    (small / "filler").unlink()
    del env["SFTTEST_FILL_DISK"]
    again = run_entrypoint(env)
    assert again.returncode == 0, again.stdout[-3000:]
    return read_summary(out)


def assert_follows(summary: dict, reference: dict, after: int) -> None:
    losses, expected = step_losses(summary), step_losses(reference)
    assert max(abs(losses[k] - expected[k]) for k in expected if k > after) < 1e-4


def on_a_small_disk(tmp_path: Path, disk_dir: Path, fill_at: int, leave: int) -> dict[str, str]:
    """The ZeRO-2 job of `runs`, its output on a small disk that another writer fills before the save at
    step `fill_at`, leaving `leave` bytes (sft/dev/faults.py)."""
    env = demo_env(tmp_path, zero_stage="2", **JOB)
    env.update(SFT_OUTPUT_DIR=str(disk_dir / "out"), SFTTEST_FILL_DISK=f"{fill_at}:{leave}:{disk_dir / 'filler'}")
    return env


def test_a_full_disk_mid_save_exits_6_keeps_the_last_complete_checkpoint_and_resumes(runs, tmp_path):
    """Before: exit 1, no summary (a 0-byte summary.json.tmp), the ranks' reports 0 bytes."""
    with tmpfs(tmp_path / "disk", "32m") as small:
        env, out = on_a_small_disk(tmp_path, small, 40, 64 * 1024), small / "out"
        result = run_entrypoint(env)
        assert result.returncode == exitcodes.TRAIN_FAILED, result.stdout[-3000:] + result.stderr[-3000:]
        assert f"error: the disk of {out} is full (" in result.stdout
        assert ("removed checkpoint-40: the failure left it incomplete; a new start resumes from checkpoint-20"
                in result.stdout)
        summary = read_summary(out)  # written: the torn checkpoint's room was enough
        assert (summary["status"], summary["exit_code"]) == ("failed", exitcodes.TRAIN_FAILED)
        assert checkpoints.problem(out / "checkpoint-20") is None and not (out / "checkpoint-40").exists()
        reference = read_summary(runs["2"][1])
        summary = resume_with_room(env, small, out)
    assert summary["resumed_from"].endswith("checkpoint-20")
    assert_follows(summary, reference, 20)
    assert summary["train"]["num_tokens"] == reference["train"]["num_tokens"]


def test_a_disk_that_would_fill_stops_at_a_checkpoint_and_the_resume_counts_every_token(runs, tmp_path):
    """After the save at step 40 the disk holds less than the rest of the run: every rank stops there (exit 3)
    instead of failing at a later save; a new start resumes at step 40 and ends with the uninterrupted run's
    losses and token counts. Before: the token count restarted from zero at a resume (6,144 at step 40
    against 10,240 uninterrupted)."""
    with tmpfs(tmp_path / "disk", "32m") as small:
        env, out = on_a_small_disk(tmp_path, small, 40, 4 * 10**6), small / "out"  # one checkpoint fits, not two
        result = run_entrypoint(env)
        assert result.returncode == exitcodes.PREFLIGHT, result.stdout[-3000:] + result.stderr[-3000:]
        assert "the disk would fill before the run ends, so it stops now, at this complete checkpoint" in result.stdout
        stopped = read_summary(out)
        assert (stopped["status"], stopped["train"]["global_step"]) == ("stopped: disk", 40)
        assert checkpoints.problem(out / "checkpoint-40") is None and not (out / "final").exists()
        reference = read_summary(runs["2"][1])
        summary = resume_with_room(env, small, out)
    assert summary["resumed_from"].endswith("checkpoint-40")
    assert_follows(summary, reference, 40)
    tokens, uninterrupted = logged_tokens(summary), logged_tokens(reference)
    assert tokens == uninterrupted  # the steps before 40 as the checkpoint's trainer_state.json logged them
    train = summary["train"]
    assert train["num_tokens"] == reference["train"]["num_tokens"] and train["tokens_before"] == uninterrupted[40]
    assert train["tokens_per_second"] == round((train["num_tokens"] - uninterrupted[40]) / train["train_runtime"], 1)


def test_deepspeed_launcher_runs_the_job(runs):
    """SFT_LAUNCHER=deepspeed: the seed's first launcher, same job, same reports (its run is one of `runs`)."""
    result, out = runs[DEEPSPEED_LAUNCHER_STAGE]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "deepspeed.launcher.runner --num_gpus 2" in result.stdout
    summary = read_summary(out)
    assert summary["status"] == "done" and summary["train"]["global_step"] == EPOCH_STEPS
    assert len(summary["probe"]["peak_reserved_gib"]) == 2
    for other, _ in runs.values():  # the others are torchrun's
        assert ("deepspeed.launcher.runner" in other.stdout) == (other is result)
