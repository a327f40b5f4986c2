"""Rows longer than SFT_MAX_LENGTH (SFT_LONG_ROWS): every training row counted once, by the data step before any
rank starts, as TRL prepares it; then truncated by TRL, dropped (the same rows in the controller and the ranks), or
refused with exit 2 before anything is written."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from transformers import AutoTokenizer

from conftest import DEMO_DATA, DEMO_MODEL, demo_env, read_summary, run_entrypoint
from sft import exitcodes
from sft.controller import data as data_step
from sft.data import DataError, longrows
from sft.data.sources import build
from sft.planner import data as data_rules
from sft.planner.inputs import Ranks
from sft.settings import Settings

LENGTH = 64  # the demo's conversations run from 19 to 95 tokens
ONE_CPU_RANK = Ranks(1, ())


@pytest.fixture(autouse=True)
def own_cache(isolated_env):
    """datasets' cache under tmp_path, offline (isolated_env)."""


@pytest.fixture(scope="module")
def lengths() -> list[int]:
    """The demo's lengths by hand, one conversation at a time, as the chat template renders them."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    return [len(tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=True)["input_ids"])
            for line in DEMO_DATA.read_text().splitlines()]


def read(tmp_path, **settings):
    s = Settings(model=str(DEMO_MODEL), dataset=str(DEMO_DATA), output_dir=str(tmp_path / "out"),
                 **{"max_length": LENGTH, "micro_batch": 1, **settings})
    return s, data_step.read(s, ONE_CPU_RANK)


def test_every_training_row_is_counted_as_trl_prepares_it(tmp_path, lengths):
    _, found = read(tmp_path)
    longer = sum(n > LENGTH for n in lengths)
    assert 0 < longer < len(lengths)
    assert found.long_rows == longrows.count(lengths, LENGTH, "truncate")
    assert found.long_rows.to_dict() == {"rows": len(lengths), "longer": longer, "longest": max(lengths),
                                         "shortest": min(lengths), "max_length": LENGTH, "action": "truncate"}
    line = (f"data: long rows: {longer} of {len(lengths)} training rows are longer than SFT_MAX_LENGTH=64 tokens "
            f"and will be cut to it (the longest: {max(lengths)}; SFT_LONG_ROWS=truncate)")
    assert line in found.notes and len(found.train) == len(lengths)  # TRL cuts them while it prepares the data
    _, fits = read(tmp_path, long_rows="error", max_length=max(lengths))
    assert fits.long_rows.longer == 0 and fits.long_rows.line().startswith("data: long rows: none of the 512 ")


def test_drop_leaves_the_same_rows_out_in_the_controller_and_the_ranks(tmp_path, lengths):
    s, found = read(tmp_path, long_rows="drop")
    kept = [i for i, n in enumerate(lengths) if n <= LENGTH]
    assert found.facts.dropped == tuple(i for i, n in enumerate(lengths) if n > LENGTH)
    assert len(found.train) == len(kept) and any(n.endswith("are left out (the longest: 95; SFT_LONG_ROWS=drop)")
                                                 for n in found.notes)
    plan, _ = data_rules.plan(s, found.facts)
    train, _ = build(plan)  # what the ranks train on, from the plan alone: nothing counted again
    assert train["messages"] == found.train["messages"]
    assert data_step.summary(found, plan)["long_rows"]["longer"] == len(lengths) - len(kept)
    with pytest.raises(DataError, match=r"SFT_LONG_ROWS=drop: every one of the 512 training rows is longer than "
                                        r"SFT_MAX_LENGTH=16 tokens, so none is left"):
        read(tmp_path, long_rows="drop", max_length=16)


def test_drop_keeps_the_held_out_evaluation_rows_apart(tmp_path):
    s, found = read(tmp_path, long_rows="drop", eval_fraction=0.1)
    plan, _ = data_rules.plan(s, found.facts)
    train, evaluation = build(plan)
    assert train["messages"] == found.train["messages"] and evaluation["messages"] == found.eval["messages"]


def test_error_refuses_them_naming_the_first_the_longest_and_a_length_that_fits(tmp_path, lengths):
    with pytest.raises(DataError) as e:
        read(tmp_path, long_rows="error")
    at = [i for i, n in enumerate(lengths) if n > LENGTH]
    first = ", ".join(f"{i + 1} ({lengths[i]}{' tokens' if k == 0 else ''})" for k, i in enumerate(at[:3]))
    assert e.value.problems == [
        f"SFT_LONG_ROWS=error: {len(at)} of 512 training rows are longer than SFT_MAX_LENGTH=64 tokens, in {DEMO_DATA} "
        f"rows {first} and {len(at) - 3} more, the longest row {lengths.index(max(lengths)) + 1} ({max(lengths)} "
        "tokens): raise SFT_MAX_LENGTH to 128 (every row fits), or set SFT_LONG_ROWS=truncate (each cut to "
        "SFT_MAX_LENGTH) or drop (left out)"]
    with pytest.raises(DataError) as held:  # rows held out: the training rows are no longer the file's, in order
        read(tmp_path, long_rows="error", eval_fraction=0.1)
    assert ", training rows " in held.value.problems[0] and ", the longest training row " in held.value.problems[0]


EITHER = "SFT_LONG_ROWS=truncate (each cut to SFT_MAX_LENGTH) or drop (left out)"


@pytest.mark.parametrize("lengths,max_length,advice", [
    # one row of ten million tokens among rows of 500: not a length for every row, one for 99% of them
    ([500] * 6 + [10_000_000] + [500] * 993, 256, "raise SFT_MAX_LENGTH to 512, which 99.9% of the rows fit, with "
     f"{EITHER} for the 1 still longer; or keep 256 with either"),
    # a few outliers where 99% fit already: truncate or drop them, not a longer length for every step
    ([100] * 997 + [10_000_000] * 3, 2048, f"99.7% of the rows fit SFT_MAX_LENGTH=2048 (the longest would need "
     f"10,000,000): set {EITHER}"),
    # the longest within twice that: every row fits, in whole blocks of 128
    ([100] * 990 + [3000] * 10, 2048, f"raise SFT_MAX_LENGTH to 3,072 (every row fits), or set {EITHER}"),
])
def test_the_fix_suggested_for_long_rows_is_a_length_most_rows_fit(lengths, max_length, advice):
    found = longrows.count(lengths, max_length, "error")
    assert found.advice() == advice
    assert "10,000,000 (every row" not in found.problem(packing=True)  # before: raise SFT_MAX_LENGTH to 10000000


def test_error_names_the_first_long_rows_and_the_longest_counted_from_1():
    found = longrows.count([10, 90, 10, 70, 80, 300, 99], 64, "error")
    assert found.first == ((1, 90), (3, 70), (4, 80)) and found.longest_at == 5
    assert found.named("chat.jsonl") == ("in chat.jsonl rows 2 (90 tokens), 4 (70), 5 (80) and 2 more, the longest "
                                         "row 6 (300 tokens)")
    assert longrows.count([10, 300], 64, "error").named() == "training row 2 (300 tokens)"  # the longest is shown


def test_error_exits_2_before_anything_is_written(tmp_path, lengths):
    result = run_entrypoint(demo_env(tmp_path, long_rows="error", max_length=LENGTH))
    assert result.returncode == exitcodes.BAD_SETTINGS, result.stdout[-3000:] + result.stderr[-3000:]
    assert (f"SFT_LONG_ROWS=error: {sum(n > LENGTH for n in lengths)} of 512 training rows are longer than "
            f"SFT_MAX_LENGTH=64 tokens, in {DEMO_DATA} rows ") in result.stdout + result.stderr
    assert not (tmp_path / "out" / "run").exists() and not list((tmp_path / "out").glob("checkpoint-*"))


@pytest.mark.slow
def test_dropped_rows_are_left_out_and_reported_before_training(tmp_path, lengths):
    kept = sum(n <= LENGTH for n in lengths)
    result = run_entrypoint(demo_env(tmp_path, long_rows="drop", max_length=LENGTH, packing="false", micro_batch=1,
                                     grad_accum=1, probe_steps=3, max_steps=3, save_steps=3))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = (f"data: long rows: {512 - kept} of 512 training rows are longer than SFT_MAX_LENGTH=64 tokens and are "
            f"left out (the longest: {max(lengths)}; SFT_LONG_ROWS=drop)")
    assert result.stdout.count(line) == 1  # counted once, by the data step, before any rank starts
    summary = read_summary(tmp_path / "out")
    assert summary["data"]["long_rows"] == {"rows": 512, "longer": 512 - kept, "longest": max(lengths),
                                            "shortest": min(lengths), "max_length": LENGTH, "action": "drop"}
    assert summary["data"]["train_rows"] == kept
    assert summary["probe"]["steps_per_epoch"] == math.ceil(kept / 2)  # 2 ranks, one conversation each a step


def test_a_large_dataset_is_counted_by_forked_processes_as_by_one(tmp_path, lengths):
    """The count of a large dataset, one forked process per core, gives every row's length in order."""
    from sft.data.tokens import Labeller

    s, found = read(tmp_path)
    labeller = Labeller(AutoTokenizer.from_pretrained(DEMO_MODEL), "all", LENGTH)
    assert longrows.measure(found.train, labeller, processes=3) == longrows.measure(found.train, labeller) == lengths


def test_the_rows_set_how_many_processes_prepare_them():
    """One per 1,000 rows begun, at most 16; never the machine's cores (the packed rows depend on it)."""
    from sft.data.tokens import processes

    rows = (0, 512, 1_000, 1_001, 2_048, 15_806, 16_001, 1_000_000)
    assert [processes(n) for n in rows] == [1, 1, 1, 2, 3, 16, 16, 16]


def test_the_data_plan_carries_the_processes_to_the_ranks(tmp_path):
    """The controller's count and the ranks' preparation take the same number, decided once from the rows."""
    s, found = read(tmp_path)
    plan, _ = data_rules.plan(s, found.facts)
    assert found.facts.rows == 512 and plan.processes == 1
    plan, _ = data_rules.plan(s, dataclasses.replace(found.facts, rows=15_806))
    assert plan.processes == 16
