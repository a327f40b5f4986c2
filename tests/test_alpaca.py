"""Alpaca's rows (instruction, input, output; system and history where there) read as conversational
prompt/completion, as LLaMA-Factory reads its 'alpaca' format, through the real data step: the prompt's turns, the
completion learnt alone, the rows' mistakes named."""

from __future__ import annotations

import json

import pytest

from conftest import DEMO_MODEL
from data_fixtures import write
from sft.controller import data as data_step
from sft.data import DataError
from sft.planner.inputs import Ranks
from sft.settings import Settings


@pytest.fixture(autouse=True)
def own_cache(isolated_env):
    """datasets' cache under tmp_path, offline (isolated_env)."""


def read(tmp_path, **settings):
    small = {"max_length": 128, "micro_batch": 1, **settings}
    return data_step.read(Settings(model=str(DEMO_MODEL), output_dir=str(tmp_path / "out"), **small), Ranks(2, ()))


def alpaca(n: int = 12, **extra) -> list[dict]:
    return [{"instruction": f"Translate word {i}.", "input": f"chat {i}", "output": f"cat {i}", **extra}
            for i in range(n)]


@pytest.mark.parametrize("name", ["a.jsonl", "a.csv", "a.parquet"])
def test_alpaca_rows_are_a_user_turn_and_an_assistant_completion(tmp_path, name):
    path = write(tmp_path / name, alpaca())
    found = read(tmp_path, dataset=str(path))
    assert found.facts.shape == "conversational prompt-completion" and found.loss_on == "completion"
    assert found.train[3]["prompt"] == [{"role": "user", "content": "Translate word 3.\nchat 3"}]
    assert found.train[3]["completion"] == [{"role": "assistant", "content": "cat 3"}]


def test_system_history_and_an_empty_input_become_the_prompts_turns(tmp_path):
    rows = alpaca(6, system="You translate.", history=[["hello", "bonjour"]])
    rows[0] |= {"input": "", "history": None}
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = read(tmp_path, dataset=str(path))
    assert found.train[0]["prompt"] == [{"role": "system", "content": "You translate."},
                                        {"role": "user", "content": "Translate word 0."}]
    assert found.train[1]["prompt"] == [{"role": "system", "content": "You translate."},
                                        {"role": "user", "content": "hello"},
                                        {"role": "assistant", "content": "bonjour"},
                                        {"role": "user", "content": "Translate word 1.\nchat 1"}]


def test_alpaca_mixes_with_conversational_prompt_completion_sources(tmp_path):
    a = write(tmp_path / "a.jsonl", alpaca(8))
    pc = write(tmp_path / "pc.jsonl", [{"prompt": [{"role": "user", "content": "q"}],
                                         "completion": [{"role": "assistant", "content": "a"}]}] * 6)
    assert len(read(tmp_path, dataset=f"{a}, {pc}").train) == 14


def test_alpaca_rows_mistakes_are_named(tmp_path):
    bad = alpaca(8)
    bad[2]["history"] = [["only a question"]]
    bad[5]["history"] = "not a list"
    for r in bad:
        r.setdefault("history", [])
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(path))
    assert e.value.problems == [f"SFT_DATASET: {path}: Alpaca's 'history' of row(s) 3, 6 is not a list of [question, "
                                "answer] pairs of text: fix those rows, or drop the column"]
    empty = write(tmp_path / "empty.jsonl", [*alpaca(6), {"instruction": "Say nothing.", "input": "", "output": ""}])
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(empty))
    (problem,) = e.value.problems
    assert "1 row(s) teach nothing" in problem and "row 7)" in problem
