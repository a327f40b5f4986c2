"""The rows tokenised and labelled exactly as TRL's SFTTrainer does it, without the Trainer and its model:
the controller measures lengths with it before any rank starts, and `entrypoint.py data` shows which tokens
carry the loss.

The tokenisation, the masks and the labels are TRL's own code: SFTTrainer._prepare_dataset, called with a
stand-in for the trainer that holds the three things that method reads of it (the tokenizer, the training
chat template, completion_only_loss). What SFTTrainer.__init__ decides before calling it is mirrored below
in a few lines, each saying which lines of TRL it mirrors; tests/test_labels.py checks the result equals
the real Trainer's labels, so a TRL upgrade that changes either fails there.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..settings.entries import is_template_file

if TYPE_CHECKING:
    from datasets import Dataset

IGNORED = -100  # the label of a token that carries no loss (the Trainer's ignore_index)

# Rows per process that prepares them (TRL's dataset_num_proc), and the most processes. TRL's preparation renders each
# row's chat template in Python, on one core per process: a Capybara-sized dataset in one process kept a GPU machine
# from its first step for most of a minute (measured: docs/data.md, 'The checks, and what they cost'; docs/speed.md,
# 'where a one-epoch run's time goes'). The count depends on the rows only, never on the machine's cores: TRL packs each
# process's share of the rows apart, so the packed rows depend on it, and a start on another machine that resumes the
# run must draw the same rows.
ROWS_PER_PROCESS = 1_000
MAX_PROCESSES = 16


def processes(rows: int) -> int:
    """How many processes prepare `rows` rows: one per ROWS_PER_PROCESS rows begun, at most MAX_PROCESSES."""
    return max(1, min(MAX_PROCESSES, -(-rows // ROWS_PER_PROCESS)))


def tokenizer(model: str, revision: str | None, chat_template: str | None, trust: bool = False):
    """The model's tokenizer, with SFT_CHAT_TEMPLATE applied as SFTTrainer applies chat_template_path. `trust`:
    SFT_TRUST_REMOTE_CODE (False: a tokenizer of the model's own code is refused, never asked about)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust)
    if chat_template is None:
        return tok
    if is_template_file(chat_template):  # SFTTrainer.__init__: a template file is read as it is
        with open(chat_template, encoding="utf-8") as f:
            tok.chat_template = f.read()
        return tok
    # trl.chat_template_utils.clone_chat_template, the tokenizer's part (the Trainer also resizes the model's
    # embeddings for the added tokens, which the tokens' ids do not depend on)
    source = AutoTokenizer.from_pretrained(chat_template, trust_remote_code=trust)
    tok.chat_template = source.get_chat_template()
    tok.add_tokens([t for t in source.added_tokens_decoder.values() if t.content not in tok.vocab])
    tok.eos_token = source.eos_token
    return tok


def special_tokens(tok, trainer_args: dict[str, Any], conversational: bool, cloned: bool) -> tuple[list[str], bool]:
    """SFTTrainer.__init__'s end-of-sequence token set on `tok` as it sets it before tokenising (args.eos_token
    replaces the tokenizer's, unless a template cloned from a model (`cloned`) replaced it after: the rows here then
    end as the ranks' do); and what it would refuse in every rank:
    (SFT_TRAINER_ARGS' tokens not in the vocabulary, as "eos_token '<x>'": its ValueError; whether the tokenizer
    lacks the eos TRL needs: to pad with where it has no pad token (the same ValueError), or to end each text or
    completion with (add_eos: a TypeError))."""
    vocab = tok.get_vocab()
    given = {name: trainer_args[name] for name in ("eos_token", "pad_token") if trainer_args.get(name) is not None}
    if unknown := [f"{name} {value!r}" for name, value in given.items() if value not in vocab]:
        return unknown, False
    if "eos_token" in given and not cloned:
        tok.eos_token = given["eos_token"]
    padded = bool(given.get("pad_token") or tok.pad_token)
    return [], tok.eos_token is None and not (conversational and padded)


def pad_note(tok, trainer_args: dict[str, Any]) -> str | None:
    """The log line for a tokenizer with no pad token, which TRL pads with its end-of-sequence token instead, on the
    tokenizer and the model's configs alike (SFTTrainer.__init__: args.pad_token or the tokenizer's, else its eos,
    after args.eos_token replaced that): silent there, yet the saved model's pad_token_id changes. None: nothing set."""
    eos = trainer_args.get("eos_token") or tok.eos_token
    if trainer_args.get("pad_token") or tok.pad_token or not eos:  # no eos either: TRL refuses to start (its error)
        return None
    return (f"data: pad token: the tokenizer has none, so TRL sets its end-of-sequence token {eos!r} (id "
            f"{tok.convert_tokens_to_ids(eos)}) as the pad token, and the saved model and tokenizer keep it; padding "
            "carries no loss, so the tokens learned are the same (to pad with another token, set pad_token in the "
            "model's tokenizer_config.json)")


def training_template(tok) -> str | None:
    """The template SFTTrainer renders assistant masks with (SFTTrainer.__init__): the model's own if it has
    {% generation %} markers (None), else TRL's training version of a template it knows (raises ValueError
    when it knows none)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if not tok.chat_template:
        raise ValueError("the tokenizer has no chat template")
    return None if has_generation_markers(tok.chat_template) else get_training_chat_template(tok)


def marks_assistant(tok) -> bool:
    """Whether TRL can tell the assistant's tokens under this chat template (assistant_only_loss needs it)."""
    try:
        training_template(tok)
    except ValueError:
        return False
    return True


class Labeller:
    """TRL's preparation of rows (tokenise, mask, label; truncate or pack), for one loss mode."""

    def __init__(self, tok, loss_on: str, max_length: int | None, trainer_args: dict[str, Any] | None = None):
        from trl import SFTConfig

        self.tok, self.loss_on, self.max_length = tok, loss_on, max_length
        defaults = {f.name: f.default for f in dataclasses.fields(SFTConfig) if f.default is not dataclasses.MISSING}
        # the arguments _prepare_dataset reads, as the ranks' SFTConfig has them (planner/arguments.py)
        self.args = SimpleNamespace(**{**defaults, **(trainer_args or {}), "max_length": max_length,
                                       "assistant_only_loss": loss_on == "assistant",
                                       "completion_only_loss": loss_on == "completion"})
        self.trainer = SimpleNamespace(
            _tokenizer=tok,
            chat_template=training_template(tok) if loss_on == "assistant" else None,
            completion_only_loss=loss_on == "completion")

    def prepare(self, rows: Dataset, packing: bool = False, truncate: bool = True) -> Dataset:
        """input_ids and labels of each row; truncated to max_length, or packed into rows of it (packing)."""
        from trl import SFTTrainer

        args = self.args if truncate else SimpleNamespace(**{**vars(self.args), "max_length": None})
        return SFTTrainer._prepare_dataset(self.trainer, rows, self.tok, args, packing, None, "train")

    def tokenise(self, rows: Dataset) -> Dataset:
        """input_ids and labels of each row, before truncation, in the rows' order: what the ranks' SFTTrainer
        truncates or packs (it skips its own tokenisation for rows that have input_ids: cache.py)."""
        args = SimpleNamespace(**{**vars(self.args), "max_length": None, "shuffle_dataset": False})
        from trl import SFTTrainer

        prepared = SFTTrainer._prepare_dataset(self.trainer, rows, self.tok, args, False, None, "train")
        return prepared.select_columns(["input_ids", "labels"])

    def lengths(self, rows: Dataset) -> list[int]:
        """Tokens per row, before truncation."""
        return [len(ids) for ids in self.prepare(rows, truncate=False)["input_ids"]]


def in_memory(dataset: Dataset, start: int, stop: int) -> Dataset:
    """Rows start..stop held in memory: what is prepared from them writes no cache file next to the data."""
    return dataset.select(range(start, min(stop, len(dataset)))).flatten_indices(keep_in_memory=True)
