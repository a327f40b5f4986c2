"""Conversations longer than SFT_MAX_LENGTH (SFT_LONG_ROWS): counted as the chat template renders them, reported
before training, then truncated by TRL, dropped, or refused before any rank starts."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoTokenizer

from conftest import DEMO_DATA, DEMO_MODEL, demo_env, read_summary, run_entrypoint
from sft import exitcodes, longrows
from sft.data import load_conversations

LENGTH = 64  # the demo's conversations run from 19 to 95 tokens


@pytest.fixture(scope="module")
def demo():
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    # the lengths by hand, one conversation at a time, as TRL's tokenizing renders them
    lengths = [len(tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=True)["input_ids"])
               for line in DEMO_DATA.read_text().splitlines()]
    return load_conversations(str(DEMO_DATA), "train"), tokenizer, lengths


def test_long_conversations_are_counted_as_the_chat_template_renders_them(demo):
    dataset, tokenizer, lengths = demo
    tokens, found = longrows.count(dataset, tokenizer, LENGTH, "truncate")
    longer = sum(n > LENGTH for n in lengths)
    assert tokens == lengths and 0 < longer < len(lengths)
    assert found == longrows.LongRows(len(lengths), longer, max(lengths), LENGTH, "truncate")
    assert found.line() == (f"long rows: {longer} of {len(lengths)} conversations are longer than SFT_MAX_LENGTH=64 "
                            f"tokens (the longest: {max(lengths)}): truncated to it (SFT_LONG_ROWS=truncate)")
    kept, _ = longrows.apply(dataset, tokenizer, LENGTH, "truncate")
    assert len(kept) == len(dataset)  # TRL cuts them at the length while it prepares the data
    assert longrows.count(dataset, tokenizer, max(lengths), "error")[1].problem() is None


def test_drop_leaves_the_long_conversations_out(demo):
    dataset, tokenizer, lengths = demo
    kept, found = longrows.apply(dataset, tokenizer, LENGTH, "drop")
    assert len(kept) == sum(n <= LENGTH for n in lengths) and found.line().endswith(": dropped (SFT_LONG_ROWS=drop)")
    assert kept["messages"] == [m for m, n in zip(dataset["messages"], lengths) if n <= LENGTH]
    with pytest.raises(longrows.LongRowsError, match=r"SFT_LONG_ROWS=drop: every one of the 512 conversations is "
                                                     r"longer than SFT_MAX_LENGTH=16 tokens, so none is left"):
        longrows.apply(dataset, tokenizer, 16, "drop")


def test_error_refuses_them_naming_how_many_and_the_longest(demo):
    dataset, tokenizer, lengths = demo
    with pytest.raises(longrows.LongRowsError) as e:
        longrows.apply(dataset, tokenizer, LENGTH, "error")
    longer = sum(n > LENGTH for n in lengths)
    assert str(e.value) == (f"SFT_LONG_ROWS=error: {longer} of 512 conversations are longer than SFT_MAX_LENGTH=64 "
                            f"tokens (the longest: {max(lengths)}): raise SFT_MAX_LENGTH to {max(lengths)}, or set "
                            "SFT_LONG_ROWS=truncate or drop")


def test_error_exits_2_before_any_rank_starts(tmp_path, demo):
    _, _, lengths = demo
    result = run_entrypoint(demo_env(tmp_path, long_rows="error", max_length=LENGTH, micro_batch=0))
    assert result.returncode == exitcodes.BAD_SETTINGS, result.stdout[-3000:] + result.stderr[-3000:]
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert problems == ["  - SFT_MICRO_BATCH='0': expected at least 1",  # reported with the others, at once
                        f"  - SFT_LONG_ROWS=error: {sum(n > LENGTH for n in lengths)} of 512 conversations are "
                        f"longer than SFT_MAX_LENGTH=64 tokens (the longest: {max(lengths)}): raise SFT_MAX_LENGTH "
                        f"to {max(lengths)}, or set SFT_LONG_ROWS=truncate or drop"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_dropped_conversations_are_left_out_and_reported_before_training(tmp_path, demo):
    _, _, lengths = demo
    kept = sum(n <= LENGTH for n in lengths)
    result = run_entrypoint(demo_env(tmp_path, long_rows="drop", max_length=LENGTH, packing="false", micro_batch=1,
                                     grad_accum=1, probe_steps=3, max_steps=3, save_steps=3))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = (f"long rows: {512 - kept} of 512 conversations are longer than SFT_MAX_LENGTH=64 tokens (the longest: "
            f"{max(lengths)}): dropped (SFT_LONG_ROWS=drop)")
    assert result.stdout.count(line) == 2  # the probe's ranks and the training's, each before its first step
    summary = read_summary(tmp_path / "out")
    assert summary["train"]["long_rows"] == {"conversations": 512, "longer": 512 - kept, "longest": max(lengths),
                                             "max_length": LENGTH, "action": "drop"}
    assert summary["probe"]["steps_per_epoch"] == math.ceil(kept / 2)  # 2 ranks, one conversation each a step
