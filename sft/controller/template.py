"""The chat template and the rows it renders, failing as one line before any rank starts, never as Jinja's traceback.

Two kinds of failure, both the library's own exceptions: a template that does not parse (jinja2's TemplateSyntaxError,
from transformers' own compiler of chat templates, with its line), and one that fails while it renders the rows
(jinja2's SecurityError from the sandbox, UndefinedError, or the template's own raise_exception, a TemplateError,
such as "roles must alternate"). The second is found by the data step's tokenisation (TRL's, outside the Trainer);
the row that fails is then found by halving the rows, so the message names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..data import DataError

if TYPE_CHECKING:
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
