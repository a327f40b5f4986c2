"""A 'system' column beside the conversations (many ShareGPT datasets carry one; LLaMA-Factory's dataset_info reads it)
is the conversation's first message, with role system, in every conversational shape, for the controller and the
ranks alike. Before, the job kept the shape's columns only and the system prompt was left out of training, silently."""

from __future__ import annotations

import pytest

from conftest import demo_env, run_entrypoint
from data_fixtures import problems, read, write
from sft.data.sources import build
from sft.handoff import DataPlan, DataSource


@pytest.fixture(autouse=True)
def own_cache(isolated_env):
    """datasets' cache under tmp_path, offline (isolated_env)."""


def sharegpt(i: int, system: object = "Talk like a pirate.", opening: str | None = None) -> dict:
    own = [{"from": "system", "value": opening}] if opening is not None else []
    return {"system": system, "conversations": [*own, {"from": "human", "value": f"Hello {i}"},
                                                {"from": "gpt", "value": f"Arr, hello {i}."}]}


def messages(i: int, system: object = "Talk like a pirate.") -> dict:
    return {"system": system, "messages": [{"role": "user", "content": f"Hello {i}"},
                                           {"role": "assistant", "content": f"Arr, hello {i}."}]}


def prompt_completion(i: int, system: object = "Talk like a pirate.") -> dict:
    return {"system": system, "prompt": [{"role": "user", "content": f"Hello {i}"}],
            "completion": [{"role": "assistant", "content": f"Arr, hello {i}."}]}


def test_the_real_data_command_shows_a_sharegpt_rows_system_prompt(tmp_path):
    """What a user runs to see what the model learns from: before, row 1 began at the user's turn."""
    path = write(tmp_path / "sharegpt.jsonl", [sharegpt(i) for i in range(20)])
    done = run_entrypoint(demo_env(tmp_path, dataset=path, packing="false"), "data", "--rows", "1", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "<|im_start|>⟦system\nTalk like a pirate.<|im_end|>\n<|im_start|>user\nHello 0<|im_end|>" in done.stdout


@pytest.mark.parametrize("make,column,role", [(sharegpt, "conversations", "from"), (messages, "messages", "role"),
                                              (prompt_completion, "prompt", "role")])
def test_the_system_column_is_the_first_message_for_the_controller_and_the_ranks(tmp_path, make, column, role):
    data = [make(i) for i in range(20)]
    data[4]["system"], data[5]["system"] = None, "  \n"  # nothing to say: no system message
    path = write(tmp_path / "d.jsonl", data)
    found = read(tmp_path, dataset=str(path))
    first = found.train[0][column][0]
    assert first[role] == "system" and first["content" if role == "role" else "value"] == "Talk like a pirate."
    assert [m[role] for m in found.train[4][column]] == [m[role] for m in found.train[5][column]] != ["system"]
    assert found.train[4][column][0][role] != "system" and "system" not in found.train.column_names
    train, _ = build(DataPlan(train=[DataSource(str(path))]))
    assert train[column] == found.train[column]


def test_a_conversation_that_opens_with_the_same_system_turn_keeps_one(tmp_path):
    path = write(tmp_path / "sg.jsonl", [sharegpt(i, opening="Talk like a pirate. ") for i in range(20)])
    found = read(tmp_path, dataset=str(path))
    assert [m["from"] for m in found.train[0]["conversations"]] == ["system", "user", "assistant"]


def test_a_system_column_that_differs_from_the_conversations_own_is_named_with_its_rows(tmp_path):
    data = [sharegpt(i, opening="Talk like a pirate.") for i in range(20)]
    data[3]["conversations"][0]["value"] = "Talk like a cat."
    data[11]["system"] = "Be brief."
    data[12]["system"] = None  # the turn alone: kept
    path = write(tmp_path / "sg.jsonl", data)
    assert problems(tmp_path, dataset=str(path)) == [
        f"SFT_DATASET: {path}: in rows 4, 12, the 'system' column and the system turn the conversation opens with "
        "differ, and keeping one would drop the other: make them the same, or keep one (null the column, or remove "
        "the turn)"]


def test_a_system_column_that_is_not_text_is_named(tmp_path):
    data = [messages(i) for i in range(20)]
    data[2]["system"] = 5
    path = write(tmp_path / "m.jsonl", data)
    assert problems(tmp_path, dataset=str(path)) == [
        f"SFT_DATASET: {path}: the 'system' column of row 3 is not text: write each row's system prompt as a string "
        "(or null for none)"]
