"""A resume on another number of ranks: the checkpoint converted with DeepSpeed's ds_to_universal, the Trainer
going on with the same global batch (accumulation adjusted), learning-rate schedule and data position.

End to end (slow): an uninterrupted run per (stage, ranks) is the reference; its checkpoint-8 alone, in a new
output folder, is resumed by the real entrypoint on another number of CPU ranks (gloo, the real launcher,
real DeepSpeed), and the 16 steps after the change are held against the reference's. Measured on this
machine (2 cores), fp32: 2 -> 1 and 1 -> 2 at ZeRO-2 and ZeRO-3, and 2 -> 4 at ZeRO-2, the losses after the
change differ from the uninterrupted run's by at most 9.5e-7 (two float32 steps at a loss of 4-8; most steps
are bit-equal: a sum of two gradients does not depend on their order), so LOSS_TOLERANCE allows 1e-5. The
tokens and the learning rate of every step are equal: each step trains on the same rows, on the same schedule.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, RandomSampler

from checkpoint_layout import make_checkpoint
from conftest import demo_env, read_summary, run_entrypoint, tmpfs
from hub_fixtures import hub_server  # noqa: F401  (a fixture)
from sft import checkpoints, exitcodes
from sft.controller import reshard
from sft.controller.output import Paths
from sft.handoff import CheckpointRecord, Split
from sft.planner.reshard import Reshard

LOSS_TOLERANCE = 1e-5  # measured: 9.5e-7 at most (module docstring)
# 24 steps of 2 ranks x 4 rows (or 1 rank x 4 rows), a checkpoint every 8, all three kept: checkpoint-8 is resumed
JOB = dict(probe_steps=0, max_steps=24, save_steps=8, save_total_limit=3, logging_steps=1, learning_rate=2e-3,
           precision="fp32", seed=0, packing="false")
AT = 8


# --- the data order, as the Trainer's dataloader deals it (accelerate, with the Trainer's settings): no rank


def rows_of_each_step(rows: int, world: int, micro: int, accum: int, epoch: int = 0) -> list[list[int]]:
    """The rows each optimizer step trains on, over every rank, as accelerate deals them to `world` ranks with
    the Trainer's dataloader settings (seedable sampler seeded with data_seed, even batches)."""
    from accelerate.data_loader import prepare_data_loader

    dealt = []
    for rank in range(world):
        data = list(range(rows))
        loader = prepare_data_loader(DataLoader(data, batch_size=micro, sampler=RandomSampler(data)),
                                     num_processes=world, process_index=rank, put_on_device=False,
                                     use_seedable_sampler=True, data_seed=0, even_batches=True)
        loader.set_epoch(epoch)
        dealt.append([batch.tolist() for batch in loader])
    steps = math.ceil(len(dealt[0]) / accum)  # a partial accumulation window is a step too, as in the Trainer
    return [sorted(r for batches in dealt for batch in batches[s * accum:(s + 1) * accum] for r in batch)
            for s in range(steps)]


@pytest.mark.parametrize("epoch", [0, 1])
def test_each_step_trains_on_the_same_rows_whatever_the_split_of_its_global_batch(epoch):
    two = rows_of_each_step(512, 2, 4, 1, epoch)
    assert len(two) == 64 and two != rows_of_each_step(512, 2, 4, 1, epoch + 1)  # a new order each epoch
    for world, micro, accum in ((1, 4, 2), (4, 2, 1), (1, 1, 8), (8, 1, 1)):
        assert rows_of_each_step(512, world, micro, accum, epoch) == two, (world, micro, accum)


def test_where_the_rows_do_not_divide_only_the_epochs_last_step_differs():
    """13 rows, 8 per step: two steps either way (so the schedule's length stays); on several ranks the last
    one is filled up with rows from the epoch's start (accelerate's even batches), on one rank it is short."""
    two, one = rows_of_each_step(13, 2, 4, 1), rows_of_each_step(13, 1, 4, 2)
    assert len(two) == len(one) == 2 and two[0] == one[0]
    assert set(one[1]) < set(two[1]) and len(one[1]) == 5 and len(two[1]) == 8
    assert set(two[1]) - set(one[1]) <= set(two[0])  # the filling: rows the epoch already trained on


# --- the controller's conversion, its failures and its tidying (a checkpoint's layout, no training)


CHANGE = Reshard(2, 1, Split(4, 1, False), Split(4, 2, False))


def test_a_disk_too_small_for_the_conversion_refuses_it_before_it_starts(tmp_path):
    with tmpfs(tmp_path / "disk", "400k") as small:
        source = make_checkpoint(small / "out", AT)
        with pytest.raises(reshard.Failed) as e:
            reshard.convert(source, CHANGE, Paths(small / "out"))
        assert e.value.exit_code == exitcodes.PREFLIGHT
        assert "(twice its ZeRO shards)" in str(e.value) and "start on as many ranks as wrote it" in str(e.value)
        assert not (small / "out" / reshard.FOLDER / f"checkpoint-{AT}").exists()


def test_a_conversion_that_fails_leaves_nothing_and_names_its_log(tmp_path):
    source = make_checkpoint(tmp_path / "out", AT)  # its shards are random bytes: DeepSpeed cannot read them
    before = _digest(source)
    with pytest.raises(reshard.Failed) as e:
        reshard.convert(source, CHANGE, Paths(tmp_path / "out"))
    assert e.value.exit_code == exitcodes.FAILED
    log = tmp_path / "out" / "run" / "reshard.log"
    assert str(e.value).startswith(f"DeepSpeed's ds_to_universal could not convert {source / f'global_step{AT}'}")
    assert f"(whole log: {log})" in str(e.value) and log.stat().st_size > 0
    assert list((tmp_path / "out" / reshard.FOLDER).iterdir()) == []  # no half conversion left
    assert _digest(source) == before


def test_a_conversion_an_earlier_start_finished_is_used_again(tmp_path, capsys):
    """A start killed after the conversion and before its first checkpoint: the next one converts nothing."""
    out = tmp_path / "out"
    source = make_checkpoint(out, AT)
    (out / reshard.FOLDER / f"checkpoint-{AT}").mkdir(parents=True)  # renamed into place: complete
    got = reshard.convert(source, CHANGE, Paths(out))
    assert got.path == out / reshard.FOLDER / f"checkpoint-{AT}" and got.summary["reused"] is True
    assert (got.summary["from_world"], got.summary["to_world"]) == (2, 1) and not (out / "run").exists()
    assert f"reshard: checkpoint-{AT} of 2 ranks, for 1 rank, converted by an earlier start" in capsys.readouterr().out


def test_converted_checkpoints_go_once_the_run_has_a_newer_one(tmp_path):
    out = tmp_path / "out"
    for step in (8, 16):
        make_checkpoint(out, step)
    for name in ("checkpoint-8", "checkpoint-16", ".checkpoint-24.partial"):
        (out / reshard.FOLDER / name).mkdir(parents=True)
    reshard.tidy(Paths(out))
    assert sorted(p.name for p in (out / reshard.FOLDER).iterdir()) == ["checkpoint-16"]  # 16 is still resumed


# --- end to end: the real entrypoint, several CPU ranks


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(stage, ranks): the output folder of an uninterrupted run (made once, on first use)."""
    made: dict[tuple[str, int], Path] = {}

    def get(stage: str, ranks: int) -> Path:
        if (stage, ranks) not in made:
            tmp = tmp_path_factory.mktemp(f"zero{stage}-ranks{ranks}")
            result = run_entrypoint(demo_env(tmp, zero_stage=stage, cpu_ranks=ranks, **JOB))
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            made[stage, ranks] = tmp / "out"
        return made[stage, ranks]

    return get


def checkpoint_alone(reference_out: Path, tmp_path: Path) -> Path:
    """A new output folder holding only the reference's checkpoint-8, as a run stopped after it leaves it."""
    out = tmp_path / "out"
    shutil.copytree(reference_out / f"checkpoint-{AT}", out / f"checkpoint-{AT}")
    return out


def assert_follows(reference_out: Path, summary: dict) -> float:
    """The steps after the resume against the uninterrupted run's: losses within LOSS_TOLERANCE, the same tokens
    (the same rows) and learning rate at every step; the largest loss difference."""
    expected, got = _history(read_summary(reference_out)), _history(summary)
    after = [step for step in expected if step > AT]
    assert after and set(after) <= got.keys()
    worst = max(abs(got[s]["loss"] - expected[s]["loss"]) for s in after)
    assert worst < LOSS_TOLERANCE, worst
    for s in after:
        assert (got[s]["num_tokens"], got[s]["learning_rate"]) == (expected[s]["num_tokens"],
                                                                   expected[s]["learning_rate"]), s
    print(f"largest loss difference after the change: {worst:.3g}")
    return worst


# ZeRO-2 from 2 ranks to 1 is the Hub's case below: the same conversion, after a download.
CASES = [("3", 2, 1, (4, 2)), ("2", 1, 2, (2, 1)), ("3", 1, 2, (2, 1)), ("2", 2, 4, (2, 1))]


@pytest.mark.slow
@pytest.mark.parametrize("stage,before,after,split", CASES, ids=[f"zero{c[0]}-{c[1]}to{c[2]}" for c in CASES])
def test_a_checkpoint_resumes_on_another_number_of_ranks(reference, tmp_path, stage, before, after, split):
    """Each rank had 4 rows per step (4 x 1): 2 -> 1 accumulates 2 micro-batches of 4, 1 -> 2 and 2 -> 4 split
    each rank's share into one micro-batch of 2."""
    uninterrupted = reference(stage, before)
    out = checkpoint_alone(uninterrupted, tmp_path)
    original = _digest(out / f"checkpoint-{AT}")
    result = run_entrypoint(demo_env(tmp_path, zero_stage=stage, cpu_ranks=after, **JOB))
    assert_resharded(result, out, uninterrupted, before, after, split)
    assert _digest(out / f"checkpoint-{AT}") == original  # only read


def assert_resharded(result, out: Path, uninterrupted: Path, before: int, after: int, split: tuple[int, int]) -> None:
    """A run that resumed checkpoint-8 of `before` ranks on `after`: converted, trained to the end with the
    uninterrupted run's losses, its new checkpoints recording the new split, the conversion gone."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = read_summary(out)
    assert summary["resumed_from"] == str(out / f"checkpoint-{AT}") and summary["ranks"] == after
    moved = summary["reshard"]
    assert (moved["from_world"], moved["to_world"], moved["converted"]) == (
        before, after, str(out / reshard.FOLDER / f"checkpoint-{AT}"))
    assert (moved["after"]["micro_batch"], moved["after"]["grad_accum"]) == split
    assert (moved["before"]["micro_batch"], moved["before"]["grad_accum"]) == (4, 1)
    assert summary["decisions"]["reshard"].startswith(f"convert from {before} to {after} rank")
    assert "reshard: converting" in result.stdout and summary["train"]["global_step"] == JOB["max_steps"]
    assert_follows(uninterrupted, summary)
    # the new checkpoints say who wrote them, and the split a later resume on as many ranks keeps
    for step in (16, 24):
        assert checkpoints.problem(out / f"checkpoint-{step}") is None
        record = CheckpointRecord.load(out / f"checkpoint-{step}" / CheckpointRecord.FILE)
        assert record.world_size == after and (record.batch.micro_batch, record.batch.grad_accum) == split
    assert not (out / reshard.FOLDER).exists()  # removed once the run had a newer checkpoint of its own


@pytest.mark.slow
def test_a_global_batch_the_new_ranks_cannot_share_stops_before_any_rank_starts(reference, tmp_path):
    out = checkpoint_alone(reference("2", 2), tmp_path)
    result = run_entrypoint(demo_env(tmp_path, zero_stage="2", cpu_ranks=3, **JOB))
    assert result.returncode == exitcodes.PREFLIGHT, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("error: the checkpoint to resume was trained with 8 rows per optimizer step (2 ranks x 4 x 1: ranks x "
            "micro-batch x accumulation), which 3 ranks cannot share evenly") in result.stdout
    assert "(1, 2, 4, 8; SFT_GPUS)" in result.stdout
    assert not (out / reshard.FOLDER).exists() and "$ " not in result.stdout  # no launcher started


@pytest.mark.slow
def test_a_checkpoint_from_the_hub_resumes_on_another_number_of_ranks(reference, hub_server, tmp_path):
    """Checkpoint-8 of a 2-rank run, uploaded by the job's own uploader to the local Hub (the real
    huggingface_hub client over HTTP); an empty disk on 1 rank downloads it, converts it and trains on."""
    from huggingface_hub import HfApi

    from hub_fixtures import WRITE_TOKEN, client_env
    from sft.hub.preflight import preflight
    from sft.hub.uploader import Uploader

    repo, uninterrupted = "alice/reshard", reference("2", 2)
    old = checkpoint_alone(uninterrupted, tmp_path / "old-disk")
    uploader = Uploader(preflight(repo, WRITE_TOKEN, endpoint=hub_server.url), old, interval_s=60, keep=3,
                        retry_s=0.2, log=lambda line: None)
    assert uploader.flush(120)
    uploader.stop(5)
    fresh = tmp_path / "fresh"
    env = demo_env(fresh, zero_stage="2", cpu_ranks=1, hub_repo=repo, upload_minutes=0.02, **JOB)
    env.update(client_env(hub_server.url, fresh / "hf-home"), HF_TOKEN=WRITE_TOKEN)
    del env["HF_HUB_DISABLE_XET"]  # the job chooses its transport itself, as for users
    result = run_entrypoint(env)
    out = fresh / "out"
    assert_resharded(result, out, uninterrupted, 2, 1, (4, 2))  # 2 -> 1 accumulates 2 micro-batches of 4
    assert f"checkpoint-{AT} downloaded from {repo} and verified" in result.stdout
    summary = read_summary(out)
    files = HfApi(endpoint=hub_server.url, token=WRITE_TOKEN).list_repo_files(repo)
    assert summary["hub"]["final"] is True and "manifest.json" in files  # the final model, at the root
    assert not any(f.startswith(reshard.FOLDER) for f in files)  # the converted folder is the job's own


def _history(summary: dict) -> dict[int, dict]:
    return {e["step"]: e for e in summary["train"]["log_history"] if "loss" in e}


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}

