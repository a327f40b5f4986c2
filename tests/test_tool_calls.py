"""Tool calls and tools' definitions a chat template renders as nothing are refused before any rank starts, naming
the rows and the fix; the demo's template renders them as Qwen3's does. Before, the demo's ChatML template rendered
an assistant's tool call as an empty turn and the tools not at all, and the job trained on that, silently."""

from __future__ import annotations

import json

import pytest

import data_fixtures
from conftest import DEMO_MODEL, demo_env, run_entrypoint
from data_fixtures import write

# the demo's template before: a message's content alone, whatever else the message carries
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' "
          "+ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(autouse=True)
def own_cache(isolated_env):
    """datasets' cache under tmp_path, offline (isolated_env)."""


def read(tmp_path, **settings):
    return data_fixtures.read(tmp_path, 512, **settings)


def problems(tmp_path, **settings) -> list[str]:
    return data_fixtures.problems(tmp_path, 512, **settings)


def chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Hello {i}"}, {"role": "assistant", "content": f"Hi {i}."}]}


def called(i: int, arguments: object = None, tools: bool = False) -> dict:
    call = {"type": "function", "function": {"name": "get_weather",
                                             "arguments": {"city": "Paris"} if arguments is None else arguments}}
    row = {"messages": [{"role": "user", "content": f"Weather in Paris {i}?"},
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}]}
    return {**row, "tools": [TOOL]} if tools else row


def template(tmp_path, text: str) -> str:
    (tmp_path / "t.jinja").write_text(text)
    return str(tmp_path / "t.jinja")


def test_the_real_data_command_refuses_tool_calls_the_template_drops(tmp_path):
    data = [chat(i) for i in range(30)]
    for i in (4, 9, 20, 27):
        data[i] = called(i, tools=True)
    path = write(tmp_path / "tools.jsonl", data)
    chatml = template(tmp_path, CHATML)
    done = run_entrypoint(demo_env(tmp_path, dataset=path, chat_template=chatml), "data", timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (f"SFT_CHAT_TEMPLATE={chatml!r}: its chat template renders no tool calls (an assistant message's "
            f"'tool_calls'), and SFT_DATASET: {path} has 4 row(s) with them (rows 5, 10, 21 and 1 more): the model "
            "would be trained on those turns without their calls. Set SFT_CHAT_TEMPLATE to a template that renders "
            "tool_calls (Qwen3's does: <tool_call> and the call as JSON), or remove the calls") in done.stderr
    assert (f"its chat template renders no tool definitions (the 'tools' column), and SFT_DATASET: {path} has 4 "
            "row(s) with them (rows 5, 10, 21 and 1 more)") in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_demo_template_renders_tool_calls_as_qwen3_does(tmp_path):
    path = write(tmp_path / "tools.jsonl", [called(i, tools=True) for i in range(20)])
    done = run_entrypoint(demo_env(tmp_path, dataset=path, packing="false"), "data", "--rows", "1", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = done.stdout.replace("⟦", "").replace("⟧", "")
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>") in shown
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in shown


def test_the_demo_template_renders_plain_conversations_as_the_chatml_one_did():
    """The measurements made on the demo (losses, speeds) stay comparable."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    rows = [json.loads(line)["messages"] for line in (DEMO_MODEL.parent / "chat.jsonl").read_text().splitlines()[:50]]
    rows.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello."}, {"role": "system", "content": "Later."}])
    for messages in rows:
        for prompt in (False, True):
            assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt) == \
                tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt, chat_template=CHATML)


def test_a_template_that_drops_the_arguments_is_named_and_json_text_arguments_are_read(tmp_path):
    names_only = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
                  "<call {{ c.function.name }}>{% endfor %}<|im_end|>\n{% endfor %}")
    path = write(tmp_path / "tools.jsonl", [called(i, arguments=json.dumps({"city": "Paris"})) for i in range(20)])
    chat_template = template(tmp_path, names_only)
    (found,) = problems(tmp_path, dataset=str(path), chat_template=chat_template)
    assert found.startswith(f"SFT_CHAT_TEMPLATE={chat_template!r}: its chat template renders tool calls without their "
                            f"arguments, and SFT_DATASET: {path} has 20 row(s) with them (rows 1, 2, 3 and 17 more)")
    assert read(tmp_path, dataset=str(path)).facts.rows == 20  # the demo's renders a string of JSON as it is


def test_tool_calls_in_the_evaluation_rows_are_named_too(tmp_path):
    train = write(tmp_path / "train.jsonl", [chat(i) for i in range(20)])
    evaluation = write(tmp_path / "eval.jsonl", [chat(0), called(1)])
    (found,) = problems(tmp_path, dataset=str(train), eval_dataset=str(evaluation),
                        chat_template=template(tmp_path, CHATML))
    assert f"and SFT_EVAL_DATASET: {evaluation} has 1 row(s) with them (row 2)" in found


def test_tools_as_json_text_are_read_as_trl_reads_them(tmp_path):
    """TRL parses a 'tools' string as JSON (its tokenize_fn): a template that drops such tools is named, and one that
    renders them passes, whatever the first rows hold ('[]', no tools)."""
    data = [{**chat(i), "tools": "[]" if i == 0 else json.dumps([TOOL]) if i % 2 else None} for i in range(20)]
    path = write(tmp_path / "tools.jsonl", data)
    (found,) = problems(tmp_path, dataset=str(path), chat_template=template(tmp_path, CHATML))
    assert "its chat template renders no tool definitions (the 'tools' column)" in found
    assert read(tmp_path, dataset=str(path)).facts.rows == 20  # the demo's renders them


def test_each_source_with_tool_calls_is_rendered_not_only_the_first(tmp_path):
    """Sources write their calls their own way: one row of each is rendered. Before, the first source's verdict
    stood for all, and a template that renders objects' arguments alone passed a second source of JSON text ones."""
    objects_only = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
                    "<call {{ c.function.name }}{% if c.function.arguments is mapping %} "
                    "{{ c.function.arguments | tojson }}{% endif %}>{% endfor %}<|im_end|>\n{% endfor %}")
    first = write(tmp_path / "objects.jsonl", [called(i) for i in range(20)])
    second = write(tmp_path / "text.jsonl", [called(i, arguments=json.dumps({"city": "Paris"})) for i in range(20)])
    (found,) = problems(tmp_path, dataset=f"{first},{second}", chat_template=template(tmp_path, objects_only))
    assert f"renders tool calls without their arguments, and SFT_DATASET: {second} has 20 row(s)" in found
