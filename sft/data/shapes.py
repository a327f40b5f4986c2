"""Which of TRL's dataset types the rows are, by TRL's own rules (trl.data_utils), as SFTTrainer reads them:
prompt/completion where both columns are there, else language modelling on 'messages' (or ShareGPT's
'conversations', which TRL converts) or 'text'; conversational where TRL's is_conversational says so of
the first row (a list of messages with a 'role')."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset


@dataclass(frozen=True)
class Shape:
    """One of TRL's dataset types: its name (TRL's), the columns it trains on, how its messages are keyed."""

    name: str
    columns: tuple[str, ...]
    conversational: bool
    prompt_completion: bool
    role_key: str = "role"  # ShareGPT's from/value rows name the role 'from'
    content_key: str = "content"  # and the content 'value'
    aliases: tuple[tuple[str, str], ...] = ()  # role names of the shape's own, and TRL's role each stands for

    @property
    def roles(self) -> dict[str, str]:
        """A role as written -> the role the chat template is given (ShareGPT's human -> user, gpt -> assistant)."""
        return dict(self.aliases)

    @property
    def message_columns(self) -> tuple[str, ...]:
        """The columns that hold lists of messages."""
        return self.columns if self.conversational else ()


MESSAGES = Shape("conversational language modeling", ("messages",), True, False)
# ShareGPT's roles, as FastChat and LLaMA-Factory read them: TRL renames from/value to role/content but keeps the
# names, which no chat template knows (Qwen3's renders a 'gpt' turn as nothing at all): mapped here, before TRL
SHAREGPT_ROLES = (("human", "user"), ("gpt", "assistant"))
SHAREGPT = Shape("conversational language modeling (ShareGPT from/value)", ("conversations",), True, False, "from",
                 "value", SHAREGPT_ROLES)
CONVERSATIONAL_PC = Shape("conversational prompt-completion", ("prompt", "completion"), True, True)
STANDARD_PC = Shape("standard prompt-completion", ("prompt", "completion"), False, True)
TEXT = Shape("standard language modeling", ("text",), False, False)
ACCEPTED = ("a 'messages' column of conversations (lists of {role, content}); 'prompt' and 'completion' columns "
            "(strings, or lists of messages); a 'text' column; or Alpaca's 'instruction', 'input' and 'output'")


def shape_of(dataset: Dataset) -> Shape | None:
    """The shape of the dataset's rows (None: no column TRL can train on, or no row to tell)."""
    if len(dataset) == 0:
        return None
    return shape_of_row(dataset[0])


def shape_of_row(row: dict[str, Any]) -> Shape | None:
    from trl.data_utils import is_conversational, is_conversational_from_value

    if "prompt" in row and "completion" in row:
        pair = {"prompt": row["prompt"], "completion": row["completion"]}
        if _nonempty_list(pair["prompt"]) and _nonempty_list(pair["completion"]):
            return CONVERSATIONAL_PC if is_conversational(pair) else None
        return STANDARD_PC if isinstance(row["prompt"], str) and isinstance(row["completion"], str) else None
    if "messages" in row:
        return MESSAGES if _nonempty_list(row["messages"]) and is_conversational({"messages": row["messages"]}) \
            else None
    if "conversations" in row:
        ok = _nonempty_list(row["conversations"]) and is_conversational_from_value(row)
        return SHAREGPT if ok else None
    if "text" in row:
        return TEXT if isinstance(row["text"], str) else None
    return None


def _nonempty_list(value: Any) -> bool:
    # TRL's rules read value[0]: an empty first conversation would raise IndexError there
    return isinstance(value, list) and len(value) > 0


def why_not(dataset: Dataset) -> str:
    """Why shape_of found no shape: the columns found, or what the first row holds instead."""
    columns = dataset.column_names
    found = f"found columns: {', '.join(columns) or 'none'}"
    if len(dataset) == 0:
        return "no rows"
    usable = [c for c in ("prompt", "completion", "messages", "conversations", "text") if c in columns]
    if not usable or usable == ["prompt"] or usable == ["completion"]:
        if len(columns) == 1 and (sep := next((c for c in ";\t|" if c in columns[0]), None)):  # Excel's ';' export
            return (f"one column, named {columns[0]!r}: a CSV whose columns are separated by {sep!r} is read as "
                    "one column: separate them with commas")
        return f"no column TRL can train on ({found}); expected {ACCEPTED}"
    row = dataset[0]
    for c in usable:
        value = row[c]
        if c in ("messages", "conversations") and isinstance(value, str) and value.lstrip().startswith("["):
            return (f"the first row's {c!r} is JSON written as text (a CSV's cells are text): conversations are "
                    "lists of messages: save them as .jsonl or .parquet")
        if isinstance(value, list) and value and isinstance(value[0], dict) and "role" not in value[0] \
                and c != "conversations":
            return (f"{c!r} holds messages without a 'role' (the first row's have keys {sorted(value[0])}): each "
                    "message needs a 'role' (system, user, assistant or tool) and its 'content'")
        if isinstance(value, list) and not value:
            return f"the first row's {c!r} is an empty conversation: remove the rows with none"
    shown = {c: _kind(row[c]) for c in usable}
    return f"the first row's {', '.join(f'{c!r} is {k}' for c, k in shown.items())}; expected {ACCEPTED}"


def _kind(value: Any) -> str:
    if isinstance(value, list):
        if not value:
            return "an empty list"
        first = value[0]
        return f"a list of objects with keys {sorted(first)}" if isinstance(first, dict) else \
            f"a list of {type(first).__name__}"
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
