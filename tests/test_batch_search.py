"""The batch search: the ways to split the rows per step, timed in short runs before the probe, the
fastest kept; a split that runs out of memory (the real OOM error, raised in the rank) is passed over,
and a resumed run keeps the split its checkpoint was trained with."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import demo_env, read_summary, run_entrypoint
from sft.planner.rules import batch_candidates as candidates
from sft.settings import from_env


def test_auto_searches_only_where_the_user_left_the_split_alone(isolated_env):
    assert from_env({}).batch_search == "auto"
    assert from_env({"SFT_MICRO_BATCH": "2"}).batch_search == "false"
    assert from_env({"SFT_GRAD_ACCUM": "4"}).batch_search == "false"
    assert from_env({"SFT_GRAD_ACCUM": "4", "SFT_BATCH_SEARCH": "true"}).batch_search == "true"


def fits_under(budget: float):
    """A planner stand-in: memory grows with the rows per pass, checkpointing keeps a quarter of it."""
    return lambda mb, checkpointing: mb * (0.25 if checkpointing else 1.0) <= budget


AUTO = (False, True)  # SFT_GRADIENT_CHECKPOINTING=auto: off where it fits, else on


def batch_candidates(*args, **kwargs) -> list[tuple[int, int, bool]]:
    return [(s.micro_batch, s.grad_accum, s.gradient_checkpointing) for s in candidates(*args, **kwargs)]


def test_auto_times_only_the_splits_that_can_be_the_fastest():
    # everything fits without checkpointing: the largest pass alone, so there is nothing to time
    assert batch_candidates(4, AUTO, fits_under(4), every=False) == [(4, 1, False)]
    # 4 rows fit only with checkpointing, 2 without: the two that can win, not 1 x 4
    assert batch_candidates(4, AUTO, fits_under(2), every=False) == [(4, 1, True), (2, 2, False)]
    # 8 rows: with checkpointing 8 fit, without 2; 4 x 2 with it, or 1 x 8 without, can only be slower
    assert batch_candidates(8, AUTO, fits_under(2), every=False) == [(8, 1, True), (2, 4, False)]
    # with checkpointing 4 fit in one pass at most, without 1
    assert batch_candidates(8, AUTO, fits_under(1), every=False) == [(4, 2, True), (1, 8, False)]
    # checkpointing set by the user: one choice, so one split, the largest that fits
    assert batch_candidates(4, (True,), fits_under(0.5), every=False) == [(2, 2, True)]
    assert batch_candidates(4, (False,), fits_under(8), every=False) == [(4, 1, False)]
    assert batch_candidates(4, AUTO, fits_under(0.1), every=False) == []  # nothing fits


def test_true_times_every_split_that_fits():
    assert batch_candidates(4, AUTO, fits_under(4), every=True) == [(4, 1, False), (2, 2, False), (1, 4, False)]
    assert batch_candidates(4, AUTO, fits_under(2), every=True) == [(4, 1, True), (2, 2, False), (1, 4, False)]
    assert len(batch_candidates(12, AUTO, fits_under(12), every=True)) == 3  # at most BATCH_SEARCH_TRIES


@pytest.mark.slow
def test_the_fastest_split_that_fits_is_kept_and_a_resume_keeps_it(tmp_path):
    # 4 rows of 128 tokens per step: three splits to time
    env = demo_env(tmp_path, batch_search="true", probe_steps=4, max_steps=4, save_steps=4, max_length=128,
                   tokens_per_step=512)
    env["SFTTEST_OOM_MICRO_BATCHES"] = "4"  # the largest split runs out of memory
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "batch search: 3 splits of 4 rows per step, 4 steps each" in result.stdout
    search = read_summary(tmp_path / "out")["batch_search"]
    tries = search["tries"]
    assert [(t["micro_batch"], t["grad_accum"]) for t in tries] == [(4, 1), (2, 2), (1, 4)]
    assert "ran out of GPU memory" in tries[0]["out_of_memory"] and tries[0]["tokens_per_second"] is None
    best = max(tries[1:], key=lambda t: t["tokens_per_second"])
    assert search["chosen"] == best
    summary = read_summary(tmp_path / "out")
    # the probe and the training ran with the chosen split, the same rows per step
    assert (summary["resolved"]["micro_batch"], summary["resolved"]["grad_accum"]) == (
        best["micro_batch"], best["grad_accum"])
    assert summary["probe"]["stage"] == summary["stage"] and summary["status"] == "done"
    record = json.loads((tmp_path / "out" / "checkpoint-4" / "sft_job.json").read_text())
    assert record["batch"] == {**{k: best[k] for k in ("micro_batch", "grad_accum", "gradient_checkpointing")},
                               "offload_activations": False}

    # a second start from the checkpoint (final/ gone): no search, the recorded split
    shutil.rmtree(tmp_path / "out" / "final")
    again = run_entrypoint(env)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "batch search:" not in again.stdout
    split = f"{best['micro_batch']} x {best['grad_accum']}, checkpointing " + (
        "on" if best["gradient_checkpointing"] else "off")
    assert f"split: {split}, as the checkpoint resumed records it (its batch search's" in again.stdout
    resumed = read_summary(tmp_path / "out")["resolved"]
    assert (resumed["micro_batch"], resumed["grad_accum"]) == (best["micro_batch"], best["grad_accum"])
