"""The data in one process, as the controller reads it and the ranks rebuild it: every source kind and file
format, TRL's shapes, the seeded mixture and held-out rows, and every bad-data problem in one line.
The end-to-end runs on two ranks are in test_data_job.py."""

from __future__ import annotations

import json

import pytest

from conftest import DEMO_MODEL
from data_fixtures import rows, save_to_disk, write
from sft.controller import data as data_step
from sft.data import DataError, files, shapes
from sft.settings import entries
from sft.data.sources import build, combine, hold_out, load
from sft.handoff import DataPlan, DataSource
from sft.planner.inputs import Ranks
from sft.settings import Settings

TWO_CPU_RANKS = Ranks(2, ())


@pytest.fixture(autouse=True)
def own_cache(isolated_env):
    """datasets' cache under tmp_path, offline (isolated_env)."""


@pytest.mark.parametrize("shape,name,expected", [
    ("messages", "chat.jsonl", shapes.MESSAGES),
    ("messages", "chat.json", shapes.MESSAGES),
    ("messages", "chat.parquet", shapes.MESSAGES),
    ("conversational_pc", "pc.jsonl", shapes.CONVERSATIONAL_PC),
    ("conversational_pc", "pc.parquet", shapes.CONVERSATIONAL_PC),
    ("standard_pc", "pc.csv", shapes.STANDARD_PC),
    ("standard_pc", "pc.json", shapes.STANDARD_PC),
    ("text", "text.csv", shapes.TEXT),
    ("text", "text.parquet", shapes.TEXT),
])
def test_each_format_loads_as_its_shape(tmp_path, shape, name, expected):
    path = write(tmp_path / name, rows(shape, 30))
    dataset = load(DataSource(str(path)))
    assert len(dataset) == 30 and shapes.shape_of(dataset) == expected


def test_sharegpt_conversations_are_conversational_by_trls_rule(tmp_path):
    path = write(tmp_path / "sharegpt.jsonl", [{"conversations": [{"from": "user", "value": "hi"},
                                                                  {"from": "assistant", "value": "hello"}]}] * 3)
    assert shapes.shape_of(load(DataSource(str(path)))) == shapes.SHAREGPT


def test_a_folders_files_named_for_splits_are_its_splits(tmp_path):
    write(tmp_path / "data" / "train.jsonl", rows("text", 40))
    write(tmp_path / "data" / "test.jsonl", rows("text", 7))
    assert len(load(DataSource(str(tmp_path / "data")))) == 40
    assert len(load(DataSource(str(tmp_path / "data"), split="test"))) == 7
    assert len(load(DataSource(str(tmp_path / "data"), split="train[:10]"))) == 10  # datasets' slicing
    with pytest.raises(DataError) as e:
        load(DataSource(str(tmp_path / "data"), split="validation"))
    assert e.value.problems[0].startswith(f"SFT_DATASET: {tmp_path / 'data'}: no split 'validation'")
    write(tmp_path / "data" / "more.jsonl", rows("text", 3))  # datasets would silently leave it out
    with pytest.raises(DataError) as e:
        load(DataSource(str(tmp_path / "data")))
    assert e.value.problems == [f"SFT_DATASET: {tmp_path / 'data'}: datasets reads only its files named for splits "
                                "(train, test, ...), and would leave out 1: more.jsonl: name every file for its "
                                "split, or none"]


def test_a_single_file_is_the_split_train(tmp_path):
    path = write(tmp_path / "one.jsonl", rows("text", 5))
    with pytest.raises(DataError) as e:
        load(DataSource(str(path), split="test"))
    assert e.value.problems == [f"SFT_DATASET: {path}: no split 'test' (a single file is the one split 'train'): "
                                "leave the split unset, or give a folder whose files are named for their splits "
                                "(train.jsonl, test.jsonl)"]
    with pytest.raises(DataError) as e:  # before: datasets' 'Unknown split "test". Should be one of ['train'].'
        load(DataSource(str(path), split="test"), "SFT_EVAL_SPLIT")
    assert e.value.problems[0].endswith("(a single file is the one split 'train'): hold evaluation rows out with "
                                        "SFT_EVAL_FRACTION, or give a file of them in SFT_EVAL_DATASET")


def test_save_to_disk_folders_are_read_as_datasets_wrote_them(tmp_path):
    save_to_disk(tmp_path / "dict", {"train": rows("messages", 12), "test": rows("messages", 3)})
    assert entries.Entry(str(tmp_path / "dict")).kind == "saved"
    assert len(load(DataSource(str(tmp_path / "dict")))) == 12
    assert len(load(DataSource(str(tmp_path / "dict"), split="test"))) == 3
    with pytest.raises(DataError, match=r"no split 'dev' \(its splits: train, test\)"):
        load(DataSource(str(tmp_path / "dict"), split="dev"))
    from datasets import Dataset

    Dataset.from_list(rows("text", 4)).save_to_disk(str(tmp_path / "one"))
    assert len(load(DataSource(str(tmp_path / "one")))) == 4
    with pytest.raises(DataError, match="a save_to_disk Dataset is one split"):
        load(DataSource(str(tmp_path / "one"), split="test"))


def test_entries_parse_amounts_and_name_what_is_wrong(tmp_path):
    assert entries.parse("a.jsonl, org/x:300 ,b/:0.5") == [
        entries.Entry("a.jsonl"), entries.Entry("org/x", rows=300), entries.Entry("b/", weight=0.5)]
    write(tmp_path / "mixed" / "a.jsonl", rows("text", 2))
    write(tmp_path / "mixed" / "b.parquet", rows("text", 2))
    (tmp_path / "empty").mkdir()
    value = f"{tmp_path / 'mixed'}, {tmp_path / 'empty'}, {tmp_path / 'nope.jsonl'}, bad name!"
    found = entries.problems("SFT_DATASET", value)
    head = f"SFT_DATASET={value!r}: "
    assert found == [
        head + f"{tmp_path / 'mixed'}: mixes json and parquet files; datasets reads one format per folder: keep one, "
        "or list the folders' files as separate sources",
        head + f"{tmp_path / 'empty'}: a folder with no .jsonl, .json, .parquet, .csv file (the text ones may end "
        "in .gz, .bz2, .xz), and not one written by datasets' save_to_disk",
        head + f"{tmp_path / 'nope.jsonl'}: no such file or folder",
        head + "bad name!: neither a local path nor a Hub name such as trl-lib/Capybara"]


def test_a_mixture_draws_each_sources_amount_the_same_way_every_time(tmp_path):
    a = write(tmp_path / "a.jsonl", rows("messages", 50))
    b = write(tmp_path / "b.parquet", rows("messages", 20))
    sources = [DataSource(str(a), rows=30), DataSource(str(b), weight=2.5)]
    loaded = [load(s) for s in sources]
    first = combine(loaded, sources, ("messages",), seed=1)
    assert len(first) == 30 + 50  # b's 20 rows twice, and 10 drawn once more
    assert first.to_list() == combine(loaded, sources, ("messages",), seed=1).to_list()  # a resume draws the same
    assert first.to_list() != combine(loaded, sources, ("messages",), seed=2).to_list()
    from_b = [json.dumps(r) for r in first.to_list()[30:]]
    assert all(from_b.count(json.dumps(r)) in (2, 3) for r in load(sources[1]).to_list())


def test_held_out_rows_are_the_same_on_every_start_and_apart_from_training(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"text": f"row {i}"} for i in range(100)])
    plan = DataPlan(train=[DataSource(str(path))], eval_fraction=0.1, seed=3)
    train, held = build(plan)
    again_train, again_held = build(plan)
    assert len(held) == 10 and len(train) == 90
    assert held["text"] == again_held["text"] and train["text"] == again_train["text"]
    assert not set(held["text"]) & set(train["text"])
    assert hold_out(load(DataSource(str(path))), 0.1, seed=4)[1]["text"] != held["text"]


def test_files_that_cannot_be_read_are_named_with_the_line(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n \n")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n\n{"text": "b"\n[1, 2]\n')
    (tmp_path / "bad.json").write_text('[{"text": "a"},\n {"text": }]\n')
    found = files.diagnose([tmp_path / n for n in ("empty.jsonl", "blank.jsonl", "bad.jsonl", "bad.json")])
    assert found == [
        f"{tmp_path / 'empty.jsonl'}: empty file",
        f"{tmp_path / 'blank.jsonl'}: empty file",
        f"{tmp_path / 'bad.jsonl'}, line 3: not JSON (Expecting ',' delimiter at column 13)",
        f"{tmp_path / 'bad.jsonl'}, line 4: a JSON list, not an object of columns",
        f"{tmp_path / 'bad.json'}, line 2 column 11: not JSON (Expecting value)"]
    with pytest.raises(DataError) as e:
        load(DataSource(str(tmp_path / "bad.jsonl")))
    assert e.value.problems[0] == f"SFT_DATASET: {tmp_path / 'bad.jsonl'}, line 3: not JSON (Expecting ',' " \
                                  "delimiter at column 13)"


def read(tmp_path, ranks: Ranks = TWO_CPU_RANKS, **settings):
    """The controller's data step on these settings (the demo model), or its DataError."""
    small = {"max_length": 128, "micro_batch": 1, **settings}  # the fixtures' few rows fill one step
    return data_step.read(Settings(model=str(DEMO_MODEL), output_dir=str(tmp_path / "out"), **small), ranks)


def test_every_row_problem_of_every_source_at_once(tmp_path):
    good = rows("messages", 6)
    bad = rows("messages", 8)
    bad[1]["messages"][0]["role"] = "human"
    bad[4]["messages"] = []
    bad[6]["messages"][1].pop("role")
    a = write(tmp_path / "a.jsonl", bad)
    b = write(tmp_path / "b.jsonl", [{"question": "q", "answer": "a"}])
    c = write(tmp_path / "c.jsonl", good)
    (tmp_path / "d.jsonl").write_text('{"messages": []\n')
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=f"{a},{b},{c},{tmp_path / 'd.jsonl'}")
    assert e.value.problems == [
        f"SFT_DATASET: {tmp_path / 'd.jsonl'}, line 1: not JSON (Expecting ',' delimiter at column 16)",
        f"SFT_DATASET: {b}: no column TRL can train on (found columns: question, answer); expected "
        + shapes.ACCEPTED,
        f"SFT_DATASET: {a}: 1 empty conversation(s) in 'messages' (row 5): remove them",
        f"SFT_DATASET: {a}: role (none), human in 'messages' of rows 2, 7: a role must be one of system, user, "
        "assistant, tool (ShareGPT's human and gpt are user and assistant)"]


def test_the_first_rows_problems_are_said_as_trl_would_meet_them(tmp_path):
    no_role = write(tmp_path / "no_role.jsonl", [{"messages": [{"content": "hi"}]}])
    empty_first = write(tmp_path / "empty_first.jsonl", [{"messages": []}, *rows("messages", 3)])
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=f"{no_role},{empty_first}")
    assert e.value.problems == [
        f"SFT_DATASET: {no_role}: 'messages' holds messages without a 'role' (the first row's have keys "
        "['content']): each message needs a 'role' (system, user, assistant or tool) and its 'content'",
        f"SFT_DATASET: {empty_first}: the first row's 'messages' is an empty conversation: remove the rows with none"]


def test_a_csv_of_conversations_or_of_semicolons_is_told_what_to_do(tmp_path):
    """Before: "the first row's 'messages' is a str" and "found columns: text;id", with the shapes TRL takes."""
    import csv

    chats = tmp_path / "chats.csv"
    with chats.open("w", newline="") as f:
        csv.writer(f).writerows([["messages"], *([json.dumps(r["messages"])] for r in rows("messages", 4))])
    semicolons = tmp_path / "semicolons.csv"
    semicolons.write_text("text;id\nHello;1\nHi;2\n")
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=f"{chats},{semicolons}")
    assert e.value.problems == [
        f"SFT_DATASET: {chats}: the first row's 'messages' is JSON written as text (a CSV's cells are text): "
        "conversations are lists of messages: save them as .jsonl or .parquet",
        f"SFT_DATASET: {semicolons}: one column, named 'text;id': a CSV whose columns are separated by ';' is read as "
        "one column: separate them with commas"]


def test_text_columns_must_hold_text(tmp_path):
    numbers = write(tmp_path / "n.csv", [{"prompt": "1 + 1 =", "completion": 2}] * 4)
    nulls = write(tmp_path / "nulls.jsonl", [{"text": "a"}, {"text": None}, {"text": "b"}])
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(numbers))
    assert e.value.problems == [f"SFT_DATASET: {numbers}: the first row's 'prompt' is a str, 'completion' is an "
                                "int; expected " + shapes.ACCEPTED]
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(nulls))
    assert e.value.problems == [f"SFT_DATASET: {nulls}: 'text' is missing or null in row 2"]


def test_sources_of_different_shapes_do_not_mix(tmp_path):
    a, b = write(tmp_path / "a.jsonl", rows("text", 20)), write(tmp_path / "b.csv", rows("standard_pc", 20))
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=f"{a},{b}")
    assert e.value.problems == [f"SFT_DATASET: the sources have different shapes ({a}: standard language modeling; "
                                f"{b}: standard prompt-completion): mix sources of one shape"]


def test_assistant_loss_needs_a_template_that_marks_turns_and_an_assistant_turn_in_each_row(tmp_path):
    data = rows("messages", 10)
    data[3]["messages"] = [{"role": "user", "content": "nobody answers"}]
    path = write(tmp_path / "chat.jsonl", data)
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(path), loss_on="assistant")
    assert len(e.value.problems) == 2
    assert e.value.problems[0].startswith("SFT_LOSS_ON=assistant: the model's chat template cannot mark")
    assert e.value.problems[1] == (f"SFT_DATASET: {path}: no assistant turn in row 4: with SFT_LOSS_ON=assistant "
                                   "such a row has no token to learn (TRL stops on it)")
    template = DEMO_MODEL.parent / "chatml-assistant-mask.jinja"
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(path), loss_on="assistant", chat_template=str(template))
    assert len(e.value.problems) == 1 and "no assistant turn in row 4" in e.value.problems[0]


def test_too_few_rows_for_one_optimizer_step(tmp_path):
    path = write(tmp_path / "few.jsonl", rows("text", 7))
    # unpacked: 2 ranks x 2 x 2 = 8 rows per step
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(path), packing=False, micro_batch=2, grad_accum=2)
    assert e.value.problems == [f"SFT_DATASET: 7 training row(s), and one optimizer step takes 8 (2 rank(s) x "
                                "micro-batch 2 x accumulation 2): take fewer rows per step (SFT_TOKENS_PER_STEP, "
                                "or SFT_MICRO_BATCH and SFT_GRAD_ACCUM), start fewer CPU ranks (SFT_CPU_RANKS), or "
                                "bring more rows"]
    # on GPUs a rank is a GPU: the advice names them (the data step reads no device, so it runs here too)
    with pytest.raises(DataError) as e:
        read(tmp_path, Ranks(2, (0, 1)), dataset=str(path), packing=False, micro_batch=2, grad_accum=2)
    assert e.value.problems[0].endswith("and SFT_GRAD_ACCUM), use fewer GPUs, or bring more rows")
    # packed: the 7 short rows fill one row of 2048 tokens, and a step takes 2 x 4 x 1
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(path), max_length=2048, micro_batch=4)
    assert e.value.problems[0].startswith("SFT_DATASET: its 7 training rows (")
    assert "pack into 1 row(s) of SFT_MAX_LENGTH=2048 tokens, and one optimizer step takes 8" in e.value.problems[0]
    # SFT_TOKENS_PER_STEP's rows (the default: 8192 tokens a GPU, 4 rows of 2048): 2 ranks x 4 x 1 too
    with pytest.raises(DataError, match="one optimizer step takes 8 .2 rank.s. x micro-batch 4 x accumulation 1."):
        read(tmp_path, dataset=str(path), max_length=2048, micro_batch=None)
    assert read(tmp_path, dataset=str(path), micro_batch=1, max_length=32).facts.rows == 7  # packs into 2 or more


def test_every_row_longer_than_max_length_unpacked(tmp_path):
    path = write(tmp_path / "long.jsonl", rows("standard_pc", 40))
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(path), packing=False, max_length=12, micro_batch=1)
    (problem,) = e.value.problems
    assert problem.startswith("SFT_DATASET: all 40 rows are longer than SFT_MAX_LENGTH=12 tokens (shortest ")
    assert problem.endswith("with SFT_PACKING=false TRL cuts each to its first 12 tokens and drops the rows left "
                            "with no token to learn; raise SFT_MAX_LENGTH")
    found = read(tmp_path, dataset=str(path), packing=False, max_length=30, micro_batch=1)
    assert any("rows are longer than SFT_MAX_LENGTH=30 tokens and will be cut to it" in n for n in found.notes)


def test_evaluation_data_is_checked_as_the_training_data(tmp_path):
    train = write(tmp_path / "train.jsonl", rows("messages", 40))
    other = write(tmp_path / "ev.csv", rows("standard_pc", 5))
    bad = rows("messages", 5)
    bad[2]["messages"][0]["role"] = "bot"
    bad_path = write(tmp_path / "bad.jsonl", bad)
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(train), eval_dataset=str(other))
    assert e.value.problems == [f"SFT_EVAL_DATASET: the evaluation data is standard prompt-completion and the "
                                "training data conversational language modeling: evaluate on data of the training's "
                                "shape"]
    with pytest.raises(DataError) as e:
        read(tmp_path, dataset=str(train), eval_dataset=str(bad_path))
    assert e.value.problems == [f"SFT_EVAL_DATASET: {bad_path}: role bot in 'messages' of row 3: a role must be one "
                                "of system, user, assistant, tool"]
    found = read(tmp_path, dataset=str(train), eval_dataset=f"{write(tmp_path / 'ev.jsonl', rows('messages', 9))}:4")
    assert (found.facts.rows, found.facts.eval_rows, len(found.eval)) == (40, 4, 4)
    found = read(tmp_path, dataset=str(train), eval_fraction=0.25)
    assert (len(found.train), len(found.eval), found.facts.eval_rows) == (30, 10, 10)
