"""Rows split over ranks (SFT_SEQUENCE_PARALLEL, DeepSpeed's Ulysses through Accelerate's ParallelismConfig), end
to end on CPU: gloo carries Ulysses' all-to-all, so two CPU ranks sharing each row must compute, token by token,
what one rank computes with the whole row, epoch after epoch; a checkpoint records the split and a resume
keeps it.

gloo's all_gather refuses tensors of different sizes, which DeepSpeed's batch adapter sends when ranks' rows
differ in length: on CPU ranks rows are padded to the whole SFT_MAX_LENGTH (planner/arguments.py _row_padding). The
GPUs' path (rows padded to a multiple of N, NCCL) is tests/test_gpu.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import DEMO_DATA, demo_env, read_summary, run_entrypoint, step_losses
from sft import exitcodes
from sft.handoff import CheckpointRecord

pytestmark = pytest.mark.slow

# Rows of 64 tokens: half the demo's conversations are longer than 32, so both halves of a split row hold
# tokens with labels. fp32 and one row per step, so the two runs differ only in how a row is computed. Two epochs
# of 24 conversations, so that the order of rows is compared epoch by epoch too.
ROWS, EPOCHS = 24, 2
STEPS = ROWS * EPOCHS
JOB = dict(max_length=64, packing="false", zero_stage="2", precision="fp32", probe_steps=0, logging_steps=1,
           micro_batch=1, grad_accum=1, learning_rate=1e-3, seed=0, max_steps=-1, epochs=EPOCHS, save_steps=9,
           save_total_limit=10)


def _rows(tmp: Path) -> Path:
    """The demo's first ROWS conversations, in a file of their own under `tmp`."""
    data = tmp / "chat.jsonl"
    data.write_text("".join(DEMO_DATA.read_text().splitlines(keepends=True)[:ROWS]))
    return data


def _run(tmp: Path, ranks: int, split: int | str, data: Path, record: bool = True):
    env = demo_env(tmp, cpu_ranks=ranks, sequence_parallel=split, dataset=str(data), **JOB)
    if record:
        env["SFTTEST_TOKEN_LOSSES"] = str(tmp / "tokens")
    return env


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """One rank, each row whole."""
    tmp = tmp_path_factory.mktemp("whole")
    result = run_entrypoint(_run(tmp, 1, 1, _rows(tmp)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    """Two ranks, each holding half of every row: one data-parallel group, so the same rows per step."""
    tmp = tmp_path_factory.mktemp("split")
    result = run_entrypoint({**_run(tmp, 2, 2, _rows(tmp)), "SFT_PROBE_STEPS": "3"})  # the probe's ranks split rows too
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp


def _forwards(path: Path) -> list[list[float]]:
    return [json.loads(line)[0] for line in path.read_text().splitlines()]  # micro-batch 1: the one row


def test_a_row_split_over_two_ranks_gives_the_whole_rows_token_losses(whole, split):
    rows = _forwards(whole / "tokens" / "rank0.jsonl")
    first, second = _forwards(split / "tokens" / "rank0.jsonl"), _forwards(split / "tokens" / "rank1.jsonl")
    assert len(rows) == len(first) == len(second) == STEPS
    crossing = 0
    for row, a, b in zip(rows, first, second):
        assert len(a) == len(b) == JOB["max_length"] // 2  # padded to the whole length on CPU, then halved
        joined = a + b  # the split run's labels are shifted before the split: token t's label is t + 1's token
        # the whole row's log-probabilities (the loss per token, negated), one per token with a next token
        assert max(abs(x - y) for x, y in zip(row, joined)) < 1e-4
        assert not any(joined[len(row):])  # padding: no label, no loss
        crossing += any(b)
    assert crossing >= len(rows) // 4  # the second half held real tokens, attending to the first half's
    # the same rows in the same order, epoch by epoch (the Trainer's epochs through DeepSpeed's batch adapter,
    # sft/ranks/patches/seqpar.py)
    losses = step_losses(read_summary(split / "out"))
    assert sorted(losses) == list(range(1, STEPS + 1))  # one row a step
    assert losses == pytest.approx(step_losses(read_summary(whole / "out")), abs=1e-4)
    summaries = [read_summary(tmp / "out") for tmp in (whole, split)]
    assert summaries[0]["train"]["num_tokens"] == summaries[1]["train"]["num_tokens"]  # each token counted once


def test_the_split_is_decided_recorded_and_reported(split):
    summary = read_summary(split / "out")
    assert summary["resolved"]["sequence_parallel"] == 2 and summary["resolved"]["attention"] == "sdpa"
    assert summary["decisions"]["sequence_parallel"].startswith("2 (SFT_SEQUENCE_PARALLEL): each rank holds 1/2")
    assert summary["probe"]["steps_per_epoch"] == ROWS  # one group: one row a step (the adapter's turns counted)
    record = CheckpointRecord.load(split / "out" / f"checkpoint-{STEPS}" / CheckpointRecord.FILE)
    assert (record.sequence_parallel, record.world_size) == (2, 2)


def test_a_resume_in_the_second_epoch_keeps_the_split_and_the_rows_order(split, tmp_path):
    """The VM dies after checkpoint-27 of the split run (final/ and the later checkpoints gone): a start asking for
    another split is refused, and one with auto resumes with the checkpoint's, three rows into the second epoch (an
    odd number: half a turn of the adapter), and trains what the uninterrupted run trained."""
    out = tmp_path / "out"
    shutil.copytree(split / "out", out)
    for gone in ("final", "checkpoint-36", "checkpoint-45", "checkpoint-48"):
        shutil.rmtree(out / gone)
    env = _run(tmp_path, 2, 2, split / "chat.jsonl", record=False)  # the rows the split run trained on
    other = run_entrypoint({**env, "SFT_SEQUENCE_PARALLEL": "1"})
    assert other.returncode == exitcodes.PREFLIGHT, other.stdout[-3000:]
    assert ("SFT_SEQUENCE_PARALLEL='1': the checkpoint to resume split each row over 2 ranks" in other.stdout
            and "set SFT_SEQUENCE_PARALLEL=2 or auto" in other.stdout)

    again = run_entrypoint({**env, "SFT_SEQUENCE_PARALLEL": "auto"})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = read_summary(out)
    assert summary["resumed_from"].endswith("checkpoint-27")
    assert summary["decisions"]["sequence_parallel"] == "2, as the checkpoint resumed was written"
    resumed, uninterrupted = step_losses(summary), step_losses(read_summary(split / "out"))
    assert {k: resumed[k] for k in range(28, STEPS + 1)} == pytest.approx(
        {k: uninterrupted[k] for k in range(28, STEPS + 1)}, abs=1e-6)
