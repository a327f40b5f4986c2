"""The chat template and the rows it renders, failing as one line before any rank starts, never as Jinja's traceback.

Two kinds of failure, both the library's own exceptions: a template that does not parse (jinja2's TemplateSyntaxError,
from transformers' own compiler of chat templates, with its line), and one that fails while it renders the rows
(jinja2's SecurityError from the sandbox, UndefinedError, or the template's own raise_exception, a TemplateError,
such as "roles must alternate"). The second is found by the data step's tokenisation (TRL's, outside the Trainer);
the row that fails is then found by halving the rows, so the message names it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..data import DataError, checks

if TYPE_CHECKING:
    from datasets import Dataset

    from ..data.shapes import Shape
    from ..settings import Settings

T = TypeVar("T")
FIX = "fix the template (SFT_CHAT_TEMPLATE), or the rows it refuses"


def owner(s: Settings) -> str:
    """Whose template it is, as a message names it."""
    return f"SFT_CHAT_TEMPLATE={s.chat_template!r}" if s.chat_template else f"SFT_MODEL={s.model!r}"


def problems(s: Settings, tok) -> list[str]:
    """The template parsed as transformers compiles it for apply_chat_template (the sandbox, its extensions)."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    template = getattr(tok, "chat_template", None) if tok is not None else None
    named = template if isinstance(template, dict) else {"": template} if template else {}
    found = []
    for name, text in named.items():
        which = f"its chat template {name!r}" if name else "its chat template"
        try:
            _compile_jinja_template(text)
        except jinja2.TemplateSyntaxError as e:
            found.append(f"{owner(s)}: {which} does not parse (line {e.lineno}: {e.message}): fix the template")
        except jinja2.TemplateError as e:
            found.append(f"{owner(s)}: {which} cannot be compiled ({type(e).__name__}: {e}): fix the template")
    return found


def tool_problems(s: Settings, tok, loss_on: str, shape: Shape, sources: list[tuple[str, Dataset]]) -> list[str]:
    """Tool calls and tools' definitions in the rows that the chat template renders as nothing (ChatML's, the demo's
    before, renders a message's content alone): TRL would train on the text without them, silently. Told by
    rendering one row that has them of each source, as TRL renders it (sources write them their own way: arguments
    as objects in one, as JSON text in another), with each call's name and arguments made marks of their own: a
    template that renders calls shows the marks, and one that renders tools changes the text with them. TRL's
    supports_tool_calling asks the same of a made-up exchange, for its training templates only; a row of the data
    keeps what the template may need of it (call ids, the tools, chat_template_kwargs)."""
    if tok is None or not tok.chat_template or not shape.conversational:
        return []
    template = _training_template(tok, loss_on)
    found = []
    for label, dataset in sources:
        calls, defined = checks.tool_rows(dataset, shape)
        lost = calls and _lost_calls(tok, template, _conversation(dataset[calls[0]], shape))
        given = next((c for i in defined[:100] if (c := _conversation(dataset[i], shape))[1]["tools"]), None)
        if lost:
            found.append(f"{owner(s)}: its chat template renders {lost}, and {label} has {len(calls)} row(s) "
                         f"with them ({checks.rows_named(calls)}): the model would be trained on those turns without "
                         "their calls. Set SFT_CHAT_TEMPLATE to a template that renders tool_calls (Qwen3's does: "
                         "<tool_call> and the call as JSON), or remove the calls")
        if given is not None and _lost_tools(tok, template, given):
            found.append(f"{owner(s)}: its chat template renders no tool definitions (the 'tools' column), and {label} "
                         f"has {len(defined)} row(s) with them ({checks.rows_named(defined)}): the model would be "
                         "trained without them. Set SFT_CHAT_TEMPLATE to a template that renders tools (Qwen3's "
                         "does, in the system turn), or remove the column")
    return found


def _training_template(tok, loss_on: str) -> str | None:
    """The template TRL renders the rows with: the marked one when the assistant's tokens alone are learned."""
    from ..data.tokens import training_template

    try:
        return training_template(tok) if loss_on == "assistant" else None
    except ValueError:  # no marked version: the loss mode's own check says so
        return None


def _conversation(row: dict, shape: Shape) -> tuple[list[dict], dict]:
    """The row's messages as the template gets them (role and content, ShareGPT's names given as sources.combine
    gives them), and the other arguments TRL passes (tools, chat_template_kwargs)."""
    messages = []
    for m in (m for column in shape.message_columns for m in row[column] or [] if isinstance(m, dict)):
        role = m.get(shape.role_key)
        rest = {k: v for k, v in m.items() if k not in (shape.role_key, shape.content_key)}
        messages.append({**rest, "role": shape.roles.get(role, role), "content": m.get(shape.content_key)})
    return messages, {"tools": _tools(row.get("tools")), **(row.get("chat_template_kwargs") or {})}


def _tools(tools):
    """The tools as TRL gives them to the template: a string of JSON parsed (its tokenize_fn), None where it is not
    JSON (TRL's tokenisation fails on the row, and names it) or holds no tools ('[]', 'null')."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            return None
    return tools or None


def _render(tok, template: str | None, conversation: tuple[list[dict], dict]) -> str | None:
    """The text of the conversation; None where the template fails on it (the tokenisation's check names that)."""
    messages, arguments = conversation
    try:
        return tok.apply_chat_template(messages, chat_template=template, tokenize=False, **arguments)
    except Exception:  # noqa: BLE001 - the row is rendered again by TRL, whose failure is named with its row
        return None


def _lost_calls(tok, template: str | None, conversation: tuple[list[dict], dict]) -> str | None:
    """What the template renders of the tool calls, where it leaves out their names or arguments (None: nothing
    left out, or the template fails on the row)."""
    messages, arguments = conversation
    marked = [{**m, "tool_calls": [_marked(c, f"sftcheck{i}x{j}") for j, c in enumerate(m["tool_calls"])]}
              if isinstance(m.get("tool_calls"), list) else m for i, m in enumerate(messages)]
    marks = [f"sftcheck{i}x{j}" for i, m in enumerate(marked) for j, c in enumerate(m.get("tool_calls") or [])
             if isinstance(c, dict)]
    if (text := _render(tok, template, (marked, arguments))) is None:
        return None
    names = all(f"{mark}name" in text for mark in marks)
    given = all(f"{mark}key" in text and f"{mark}value" in text for mark in marks)
    if names and given:
        return None
    return "tool calls without their names" if given else "tool calls without their arguments" if names else \
        "no tool calls (an assistant message's 'tool_calls')"


def _marked(call, mark: str):
    """The call with its name and arguments made marks found nowhere else in the text (a string of JSON where the
    arguments were one)."""
    def function(f: dict) -> dict:
        arguments = {f"{mark}key": f"{mark}value"}
        return {**f, "name": f"{mark}name",
                "arguments": json.dumps(arguments) if isinstance(f.get("arguments"), str) else arguments}

    if isinstance(call, dict) and isinstance(call.get("function"), dict):  # OpenAI's {"type", "function": {...}}
        return {**call, "function": function(call["function"])}
    return function(call) if isinstance(call, dict) else call


def _lost_tools(tok, template: str | None, conversation: tuple[list[dict], dict]) -> bool:
    """Whether the template renders the conversation the same with its tools and without them."""
    messages, arguments = conversation
    with_tools, without = _render(tok, template, conversation), _render(tok, template, (messages, {**arguments,
                                                                                                   "tools": None}))
    return with_tools is not None and with_tools == without


def guarded(check: Callable[[], T], s: Settings, found) -> T:
    """`check()` (the data step's tokenisation), a template failing in it made one line naming the row: DataError.
    Another error that one row reproduces is that row's (DataError too); one that none does is the job's, raised."""
    import jinja2

    try:
        return check()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - sorted below: the template's, a row's, or the job's own
        row = _first_failing(s, found)
        if isinstance(e, jinja2.TemplateError):
            where = f" on {row}" if row else ""
            raise DataError([f"{owner(s)}: its chat template fails{where} ({type(e).__name__}: {_line(e)}): "
                             f"{FIX}"]) from None
        if row is None:
            raise
        raise DataError([f"SFT_DATASET: {row} cannot be tokenised as TRL does ({type(e).__name__}: {_line(e)}): "
                         "fix or remove it"]) from None


def _first_failing(s: Settings, found) -> str | None:
    """'row N of the training rows' (from 1, as drawn) that fails alone, or of the evaluation rows; None: none does."""
    import json

    from ..data.tokens import Labeller

    try:
        labeller = Labeller(found.tokenizer, found.loss_on, s.max_length, json.loads(s.trainer_args or "{}"))
    except Exception:  # noqa: BLE001 - nothing to halve with: the caller says what it can
        return None
    for name, rows in (("training", found.train), ("evaluation", found.eval)):
        if rows is not None and (at := _halve(rows, labeller)) is not None:
            return f"row {at + 1} of the {name} rows"
    return None


def _halve(rows, labeller) -> int | None:
    """The first row (from 0) whose tokenisation fails, by halving: about twice the rows tokenised."""
    from ..data.tokens import in_memory

    def fails(start: int, stop: int) -> bool:
        try:
            labeller.lengths(in_memory(rows, start, stop))
        except Exception:  # noqa: BLE001 - any failure is what is looked for
            return True
        return False

    lo, hi = 0, len(rows)
    if hi == 0 or not fails(lo, hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fails(lo, mid) else (mid, hi)
    return lo if fails(lo, lo + 1) else None  # failing only with others: no one row to name


def _line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
