"""The data mistakes people make (issue 46), each a line naming the file or the rows and the fix, exit 2, never a
traceback: files that are not UTF-8, ShareGPT's own role names, rows that teach nothing (SFT_EMPTY_ROWS), and chat
templates that do not parse or fail on a row. The data step runs in this process; the real entrypoint for the
cases the issue met through it."""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma

import pytest

from conftest import demo_env, run_entrypoint
from data_fixtures import problems, read, rows, write
from sft.controller import data as data_step
from sft.data import files
from sft.data.tokens import Labeller, in_memory
from sft.data.sources import DataPlan, build
from sft.handoff import DataSource
from sft.settings import entries

CP1252_FIX = "datasets reads UTF-8 only: save it as UTF-8 (e.g. iconv -f CP1252 -t UTF-8"


@pytest.fixture(autouse=True)
def own_cache(isolated_env):
    """datasets' cache under tmp_path, offline (isolated_env)."""


def jsonl(data: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data)


def chats(n: int = 12) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Où est le café {i} ?"},
                          {"role": "assistant", "content": f"Ici, le café {i}."}]} for i in range(n)]


# --- encodings


def test_a_latin1_file_names_the_file_the_line_and_the_encoding(tmp_path):
    path = tmp_path / "export.jsonl"
    path.write_bytes(jsonl(chats()).encode("cp1252"))
    (found,) = problems(tmp_path, dataset=str(path))
    assert found.startswith(f"SFT_DATASET: {path}: is not UTF-8 from line 1, byte 45 (0xF9); it reads as "
                            "Windows-1252 (cp1252")
    assert CP1252_FIX in found


@pytest.mark.parametrize("codec,name", [("utf-16", "UTF-16 LE"), ("utf-32", "UTF-32 LE"), ("utf-16-be", None)])
def test_a_wide_encoding_is_named_with_or_without_its_mark(tmp_path, codec, name):
    path = tmp_path / "wide.jsonl"
    path.write_bytes((codecs.BOM_UTF16_BE if codec == "utf-16-be" else b"") + jsonl(chats()).encode(codec))
    found = files.encoding_problem(path)
    assert found.startswith(f"{path}: is {name or 'UTF-16 BE'} (its byte-order mark says so)")


def test_a_wide_file_without_a_mark_is_told_by_its_zero_bytes(tmp_path):
    path = tmp_path / "wide.jsonl"
    path.write_bytes(jsonl(chats()).encode("utf-16-le"))
    assert "is UTF-16 or UTF-32 without a byte-order mark" in files.encoding_problem(path)


def test_a_file_cut_inside_a_character_is_named(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_bytes(jsonl(chats(2)).encode()[:-6] + "é".encode()[:1])
    assert "ends inside a UTF-8 character (line 2): the file was cut short" in files.encoding_problem(path)


def test_the_bad_line_is_found_past_the_first_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CHUNK", 64)  # many chunks, the bad byte far into the file
    path = tmp_path / "late.csv"
    path.write_bytes(("prompt,completion\n" + "".join(f"question {i},answer {i}\n" for i in range(40))).encode()
                     + "café,oui\n".encode("latin-1"))
    assert files.encoding_problem(path).startswith(f"{path}: is not UTF-8 from line 42, byte 4 (0xE9)")


def test_every_bad_file_of_a_folder_is_named_and_the_good_ones_pass(tmp_path):
    folder = tmp_path / "data"
    write(folder / "a.jsonl", rows("messages", 8))
    (folder / "b.jsonl").write_bytes(jsonl(chats()).encode("latin-1"))
    (found,) = problems(tmp_path, dataset=str(folder))
    assert found.startswith(f"SFT_DATASET: {folder / 'b.jsonl'}: is not UTF-8 from line 1")


@pytest.mark.parametrize("form", ["bom", "crlf", "cr"])
def test_a_utf8_mark_and_every_line_ending_read_as_they_are(tmp_path, form):
    text = jsonl(chats())
    data = {"bom": codecs.BOM_UTF8 + text.encode(), "crlf": text.replace("\n", "\r\n").encode(),
            "cr": text.replace("\n", "\r").encode()}[form]
    (tmp_path / "chat.jsonl").write_bytes(data)
    found = read(tmp_path, dataset=str(tmp_path / "chat.jsonl"))
    assert len(found.train) == 12 and found.train[0]["messages"][0]["content"] == "Où est le café 0 ?"


# --- compressed files (datasets decompresses .gz, .bz2 and .xz of the text formats itself)

COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


@pytest.mark.parametrize("name", ["chat.jsonl.gz", "chat.jsonl.bz2", "chat.jsonl.xz", "chat.json.gz"])
def test_a_compressed_file_reads_as_the_same_rows(tmp_path, name):
    text = jsonl(chats()) if ".jsonl" in name else json.dumps(chats())
    path = tmp_path / name
    path.write_bytes(COMPRESS[path.suffix](text.encode()))
    found = read(tmp_path, dataset=str(path))
    assert len(found.train) == 12 and found.train[5]["messages"][1]["content"] == "Ici, le café 5."


def test_a_folder_of_plain_and_compressed_csv_reads_every_file(tmp_path):
    folder = tmp_path / "qa"
    write(folder / "a.csv", rows("standard_pc", 8))
    write(tmp_path / "b.csv", rows("standard_pc", 6))
    (folder / "b.csv.gz").write_bytes(gzip.compress((tmp_path / "b.csv").read_bytes()))
    assert len(read(tmp_path, dataset=str(folder)).train) == 14


def test_a_compressed_files_mistakes_are_named_as_a_plain_ones(tmp_path):
    latin, bad, cut, fake = (tmp_path / n for n in ("latin.jsonl.gz", "bad.jsonl.xz", "cut.jsonl.gz", "fake.csv.gz"))
    latin.write_bytes(gzip.compress(jsonl(chats()).encode("cp1252")))
    bad.write_bytes(lzma.compress((jsonl(chats(3)) + "{not json\n").encode()))
    cut.write_bytes(gzip.compress(jsonl(chats(40)).encode())[:60])
    fake.write_bytes(b"prompt,completion\nq,a\n")  # named .gz, not compressed
    (found,) = problems(tmp_path, dataset=str(latin))
    assert found.startswith(f"SFT_DATASET: {latin}: decompressed, is not UTF-8 from line 1, byte 45 (0xF9)")
    assert "gzip -dc latin.jsonl.gz | iconv -f CP1252 -t UTF-8 | gzip > utf8-latin.jsonl.gz" in found
    assert problems(tmp_path, dataset=str(bad)) == [f"SFT_DATASET: {bad}, line 4: not JSON (Expecting property "
                                                    "name enclosed in double quotes at column 2)"]
    (found,) = problems(tmp_path, dataset=str(cut))
    assert found.startswith(f"SFT_DATASET: {cut}: cannot be read (") and "ended before" in found
    (found,) = problems(tmp_path, dataset=str(fake))
    assert found.startswith(f"SFT_DATASET: {fake}: cannot be read (Not a gzipped file")


def test_a_zstd_or_text_file_is_refused_with_the_formats_read(tmp_path):
    for name in ("chat.jsonl.zst", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    found = entries.problems("SFT_DATASET", f"{tmp_path / 'chat.jsonl.zst'}, {tmp_path / 'notes.txt'}")
    assert len(found) == 2 and all("expected a .jsonl, .json, .parquet, .csv file (the text ones may end in .gz, "
                                   ".bz2, .xz)" in line for line in found)


def test_the_real_job_refuses_a_latin1_file_with_exit_2(tmp_path):
    """Issue 46: a pyarrow UnicodeDecodeError traceback from both `data` and `run`, the file not named, exit 1."""
    path = tmp_path / "export.jsonl"
    path.write_bytes(jsonl(chats(40)).encode("latin-1"))
    for command in ("data", "run"):
        done = run_entrypoint(demo_env(tmp_path, dataset=path), command, timeout=300)
        assert done.returncode == 2, done.stderr[-3000:]
        assert "Traceback" not in done.stdout + done.stderr
        assert f"SFT_DATASET: {path}: is not UTF-8 from line 1" in done.stderr + done.stdout
        assert not (tmp_path / "out").exists()


# --- ShareGPT


def sharegpt(n: int = 12, gpt: str = "Hello {i}.") -> list[dict]:
    return [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": f"Hi {i}"},
                               {"from": "gpt", "value": gpt.format(i=i)}]} for i in range(n)]


def test_sharegpt_human_and_gpt_are_read_as_user_and_assistant(tmp_path):
    """Issue 46: refused with exit 2, although the message stated the mapping. The chat template knows user and
    assistant only (Qwen3's rendered a 'gpt' turn as nothing), so the rows TRL gets say those."""
    path = write(tmp_path / "sharegpt.jsonl", sharegpt())
    found = read(tmp_path, dataset=str(path))
    assert [m["from"] for m in found.train[0]["conversations"]] == ["system", "user", "assistant"]
    assert found.facts.shape == "conversational language modeling (ShareGPT from/value)"
    prepared = Labeller(found.tokenizer, found.loss_on, 128).prepare(in_memory(found.train, 0, 1))  # TRL's own
    text = found.tokenizer.decode(prepared[0]["input_ids"])
    assert "<|im_start|>user\nHi 0<|im_end|>" in text and "<|im_start|>assistant\nHello 0.<|im_end|>" in text


def test_the_ranks_rebuild_sharegpt_rows_with_the_same_roles(tmp_path):
    path = write(tmp_path / "sharegpt.jsonl", sharegpt())
    train, _ = build(DataPlan(train=[DataSource(str(path))]))
    assert [m["from"] for m in train[3]["conversations"]] == ["system", "user", "assistant"]


def test_an_unknown_sharegpt_role_is_still_refused(tmp_path):
    data = sharegpt()
    data[4]["conversations"][1]["from"] = "bing"
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "sg.jsonl", data)))
    assert "role bing in 'conversations' of row 5: a role must be one of system, user, assistant, tool" in found


# --- rows that teach nothing


def test_an_empty_assistant_turn_is_refused_with_its_rows(tmp_path):
    """Issue 46: a conversation whose assistant turn was empty trained silently."""
    data = chats(20)
    data[2]["messages"][1]["content"] = ""
    data[9]["messages"][1]["content"] = "  \n"
    data[11]["messages"][1]["content"] = None
    data[14]["messages"][1] = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "now", "arguments": "{}"}}]}  # a tool call is something to learn
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "chat.jsonl", data)))
    assert found == (f"SFT_DATASET: {tmp_path / 'chat.jsonl'}: 3 row(s) teach nothing (an empty text, an empty "
                     "completion or an assistant turn with no content: rows 3, 10, 12): such a row teaches the model "
                     "to answer nothing: fill or remove them, or set SFT_EMPTY_ROWS=drop to leave them out")


@pytest.mark.parametrize("shape,empty", [("text", {"text": " "}), ("standard_pc", {"prompt": "Q?", "completion": ""}),
                                         ("conversational_pc", {"prompt": [{"role": "user", "content": "Q?"}],
                                                                "completion": [{"role": "assistant", "content": ""}]})])
def test_an_empty_text_or_completion_is_refused(tmp_path, shape, empty):
    data = rows(shape, 10)
    data[6] = empty
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "d.jsonl", data)))
    assert "1 row(s) teach nothing" in found and "row 7)" in found


def test_sharegpt_empty_gpt_turns_are_rows_that_teach_nothing(tmp_path):
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "sg.jsonl", sharegpt(gpt=""))))
    assert "12 row(s) teach nothing" in found


def test_drop_leaves_them_out_counted_and_the_ranks_agree(tmp_path):
    data = chats(30)
    for i in (0, 7, 21):
        data[i]["messages"][1]["content"] = ""
    path = write(tmp_path / "chat.jsonl", data)
    found = read(tmp_path, dataset=str(path), empty_rows="drop", eval_fraction=0.1)
    assert found.empty_dropped == 3 and len(found.train) + len(found.eval) == 27
    assert "data: SFT_DATASET: 3 row(s) teach nothing (an empty text, an empty completion or an assistant turn with no " \
           "content) and are left out (SFT_EMPTY_ROWS=drop)" in found.notes
    assert data_step.summary(found, _plan())["empty_rows_dropped"] == 3
    train, held = build(DataPlan(train=[DataSource(str(path))], eval_fraction=0.1, drop_empty=True, seed=42))
    assert train["messages"] == found.train["messages"] and held["messages"] == found.eval["messages"]


def _plan():
    from sft.handoff import DataPlan as Plan

    return Plan(train=[])


def test_drop_that_leaves_a_source_empty_is_refused(tmp_path):
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "sg.jsonl", sharegpt(gpt=" "))), empty_rows="drop")
    assert found.endswith("every row teaches nothing (an empty text, an empty completion or an assistant turn with "
                          "no content), so SFT_EMPTY_ROWS=drop leaves none: fill them, or remove the source")


# --- chat templates


def template(tmp_path, text: str) -> str:
    (tmp_path / "t.jinja").write_text(text)
    return str(tmp_path / "t.jinja")


def test_a_template_that_does_not_parse_names_its_line(tmp_path):
    chat = template(tmp_path, "{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "c.jsonl", chats())), chat_template=chat)
    assert found == f"SFT_CHAT_TEMPLATE={chat!r}: its chat template does not parse (line 2: unexpected '}}'): fix the " \
                    "template"


def test_a_template_the_sandbox_blocks_is_one_line(tmp_path):
    chat = template(tmp_path, "{% for m in messages %}{{ m.content.__class__.__mro__ }}{% endfor %}")
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "c.jsonl", chats())), chat_template=chat)
    assert found.startswith(f"SFT_CHAT_TEMPLATE={chat!r}: its chat template fails on row 1 of the training rows "
                            "(SecurityError: access to attribute '__class__' of 'str' object is unsafe")


def test_a_template_that_refuses_one_row_names_that_row(tmp_path):
    chat = template(tmp_path, "{% for m in messages %}{% if m.content == 'stop' %}{{ raise_exception('no stop "
                              "here') }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    data = chats(200)
    data[137]["messages"][0]["content"] = "stop"
    (found,) = problems(tmp_path, dataset=str(write(tmp_path / "c.jsonl", data)), chat_template=chat)
    assert found == (f"SFT_CHAT_TEMPLATE={chat!r}: its chat template fails on row 138 of the training rows "
                     "(TemplateError: no stop here): fix the template (SFT_CHAT_TEMPLATE), or the rows it refuses")


def test_the_real_data_command_refuses_a_template_typo_with_exit_2(tmp_path):
    chat = template(tmp_path, "{% for m in messages %}{{ m.content }{% endfor %}")
    done = run_entrypoint(demo_env(tmp_path, chat_template=chat), "data", timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "its chat template does not parse (line 1: unexpected '}')" in done.stderr


# --- message contents no chat template renders; sources whose columns are typed differently


def test_a_message_without_content_is_named_and_a_tool_call_needs_none(tmp_path):
    """Before, ChatML's template failed on the row (blamed as the template's), and Qwen3's rendered an empty user
    turn and trained on it, silently."""
    data = chats(40)
    data[2]["messages"][0]["content"] = None
    del data[5]["messages"][0]["content"]
    path = tmp_path / "nulls.jsonl"
    path.write_text(jsonl(data))
    assert problems(tmp_path, dataset=str(path)) == [
        f"SFT_DATASET: {path}: in 'messages' of rows 3, 6: a user message with no 'content' (null or missing): "
        "give each message its text"]
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "café"}}}
    tools = [{"messages": [{"role": "user", "content": f"Find {i}"},
                           {"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "content": "found"}, {"role": "assistant", "content": "Done."}]}
             for i in range(40)]
    path.write_text(jsonl(tools))
    from sft.data import checks
    from sft.data.shapes import MESSAGES
    from sft.data.sources import load

    assert checks.row_problems(load(DataSource(str(path))), MESSAGES, "tools.jsonl", "all") == []


def test_content_as_a_list_of_parts_is_named_not_rendered_as_nothing(tmp_path):
    """OpenAI's parts ([{"type": "text", "text": ...}]): Qwen3's template renders them as '', ChatML's fails."""
    data = chats(40)
    for row in data[:3]:
        row["messages"][0]["content"] = [{"type": "text", "text": row["messages"][0]["content"]}]
    path = tmp_path / "parts.jsonl"
    path.write_text(jsonl(data))
    assert problems(tmp_path, dataset=str(path)) == [
        f"SFT_DATASET: {path}: in 'messages' of rows 1, 2, 3: 'content' is a list of parts (OpenAI's [{{\"type\": "
        "\"text\", \"text\": ...}]), which a text model's chat template renders as nothing or fails on: write each "
        "message's content as one string"]


@pytest.mark.parametrize("content", [{"text": "Hi."}, 42])
def test_content_as_an_object_or_a_number_is_named_not_rendered_as_nothing(tmp_path, content):
    """Before: the demo's template (Qwen3's) rendered the assistant's turn as nothing, and it trained so, silently."""
    data = chats(40)
    data[4]["messages"][-1]["content"] = content
    path = tmp_path / "object.jsonl"
    path.write_text(jsonl(data))
    assert problems(tmp_path, dataset=str(path)) == [
        f"SFT_DATASET: {path}: in 'messages' of row 5: 'content' is an object or a number, not text, which a chat "
        "template renders as nothing or as Python would print it: write each message's content as one string"]


def test_plain_rows_then_rows_with_tool_calls_mix_in_either_order(tmp_path):
    """datasets types messages with tool calls as JSON text and plain ones as structs: a struct casts to JSON, not
    back. Before, the plain source first failed with a traceback (TypeError: Couldn't cast array of type string)."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
    tools = [{"messages": [{"role": "user", "content": f"Find {i}"},
                           {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "content": "found"}, {"role": "assistant", "content": "Done."}]}
             for i in range(20)]
    from sft.data.sources import combine, load_all

    write(tmp_path / "plain.jsonl", chats(20))
    write(tmp_path / "tools.jsonl", tools)
    for order in ("plain.jsonl, tools.jsonl", "tools.jsonl, plain.jsonl"):
        sources = [DataSource(str(tmp_path / name)) for name in order.split(", ")]
        rows_ = combine(load_all(sources, "SFT_DATASET"), sources, ("messages",), 0)
        assert len(rows_) == 40
        roles = [[m["role"] for m in r] for r in rows_["messages"]]
        assert roles.count(["user", "assistant", "tool", "assistant"]) == 20 and roles.count(["user", "assistant"]) == 20


def test_a_mixtures_tools_column_is_kept_for_the_rows_that_have_one(tmp_path):
    """Before, a `tools` column was kept only where every source had one: mixed with plain rows, the tool rows lost
    their tools' definitions (the system prompt the template renders from them), silently."""
    from sft.data.sources import combine, load_all

    tool = {"type": "function", "function": {"name": "lookup", "description": "Look up a word.",
                                             "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    write(tmp_path / "tools.jsonl", [{**row, "tools": [tool]} for row in chats(10)])
    write(tmp_path / "plain.jsonl", chats(10))
    for order in (("tools.jsonl", "plain.jsonl"), ("plain.jsonl", "tools.jsonl")):
        sources = [DataSource(str(tmp_path / name)) for name in order]
        mixed = combine(load_all(sources, "SFT_DATASET"), sources, ("messages",), 0)
        kept = [t for t in mixed["tools"] if t]
        assert len(mixed) == 20 and len(kept) == 10, order
        assert all(t[0]["function"]["name"] == "lookup" for t in kept)


def test_a_folder_whose_files_have_different_columns_says_so_and_how_to_read_them(tmp_path):
    """Before: 'cannot be read: An error occurred while generating the dataset (Couldn't cast)'. An `id` column in
    one file is enough: datasets reads a folder's files as one table."""
    folder = tmp_path / "chats"
    write(folder / "a.jsonl", chats(20))
    write(folder / "b.jsonl", [{**row, "id": i} for i, row in enumerate(chats(20))])
    assert problems(tmp_path, dataset=str(folder)) == [
        f"SFT_DATASET: {folder}: cannot be read: its files have different columns (datasets reads a folder's files "
        "as one table): name the files in SFT_DATASET, separated by commas (a mixture takes its shape's columns of "
        "each), or give them the same columns"]
    assert len(read(tmp_path, dataset=f"{folder / 'a.jsonl'}, {folder / 'b.jsonl'}").train) == 40


# --- SFT_EVAL_FRACTION


def test_an_eval_fraction_that_leaves_no_training_row_names_the_rows_and_the_fractions_that_work(tmp_path):
    """Before: datasets' own words ("With n_samples=512, test_size=0.9999 and train_size=None, the resulting train
    set will be empty. Adjust any of the aforementioned parameters.")."""
    result = run_entrypoint(demo_env(tmp_path, eval_fraction=0.9999), "data", "--rows", "0")
    assert result.returncode == 2 and "aforementioned" not in result.stderr, result.stderr[-2000:]
    assert ("SFT_EVAL_FRACTION=0.9999 holds out 512 of the 512 training rows (rounded up), leaving none to train on: "
            "with 512 rows a fraction above 0 and at most 0.998 keeps a row on both sides") in result.stderr
    tiny = run_entrypoint(demo_env(tmp_path, eval_fraction=0.0001), "data", "--rows", "0")  # rounded up: one row
    assert tiny.returncode == 0 and "data: evaluation: 1 rows, 0.0001 of the training rows" in tiny.stdout


def test_the_largest_eval_fraction_said_splits_and_one_row_cannot():
    from datasets import Dataset

    from sft.data.sources import hold_out
    from sft.planner.data import held_out_problem

    for n in (2, 3, 7, 512, 100_000):
        most = float(held_out_problem(1.0 - 1e-12, n).rsplit("at most ", 1)[1].split()[0])
        assert held_out_problem(most, n) is None and held_out_problem(1e-6, n) is None
        kept, held = hold_out(Dataset.from_dict({"i": list(range(n))}), most, 0)
        assert len(kept) >= 1 and len(held) >= 1
    assert held_out_problem(0.5, 1).endswith("one row cannot be split: give more rows, or evaluation rows of their "
                                             "own in SFT_EVAL_DATASET")
