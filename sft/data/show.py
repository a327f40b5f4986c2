"""The first rows as the model sees them, for `entrypoint.py data`: the text of their tokens, with the tokens
that carry the loss between ⟦ and ⟧ (or one token a line with --tokens). The labels are TRL's (tokens.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .tokens import IGNORED, Labeller, in_memory

if TYPE_CHECKING:
    from datasets import Dataset

OPEN, CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧: brackets no chat template or dataset is likely to hold


def render(rows: Dataset, labeller: Labeller, count: int, packing: bool, per_token: bool = False) -> str:
    """The first `count` rows: tokens, how many carry the loss, what SFT_MAX_LENGTH cuts."""
    prepared = labeller.prepare(in_memory(rows, 0, count), truncate=False)
    limit = labeller.max_length
    out = [f"{OPEN}...{CLOSE}: the tokens that carry the loss (the model learns to predict them); the rest is "
           "context only (a row's first token too: nothing before it predicts it)."]
    for number, row in enumerate(prepared, start=1):
        ids, labels = row["input_ids"], learned_labels(row["labels"])
        learned = sum(label != IGNORED for label in labels)
        cut = len(ids) - limit if limit is not None and len(ids) > limit else 0
        head = f"\nrow {number}: {len(ids)} tokens, {learned} carry the loss"
        if cut:
            kept = sum(label != IGNORED for label in labels[:limit])
            fate = ("packing cuts it" if packing else "it is cut") + f" to its first {limit} (SFT_MAX_LENGTH)"
            head += f"; {fate}: {cut} tokens dropped, {kept} carrying the loss left" + (
                "; TRL then drops the row: nothing left to learn" if not packing and kept == 0 else "")
        out.append(head)
        out.append(_tokens(labeller.tok, ids, labels) if per_token else _spans(labeller.tok, ids, labels))
    return "\n".join(out)


def learned_labels(labels: list[int]) -> list[int]:
    """TRL's labels as the loss uses them: the first token is never predicted (the model shifts the labels by
    one; packed, TRL's collator masks each sequence's first token)."""
    return [IGNORED, *labels[1:]] if labels else labels


def _spans(tok, ids: list[int], labels: list[int]) -> str:
    """The text with each run of loss-carrying tokens between the brackets."""
    text, run, inside = [], [], False
    for token, label in zip(ids, labels, strict=True):
        if (label != IGNORED) != inside:
            text.append(tok.decode(run))
            text.append(OPEN if not inside else CLOSE)
            run, inside = [], not inside
        run.append(token)
    text.append(tok.decode(run) + (CLOSE if inside else ""))
    return "".join(text)


def _tokens(tok, ids: list[int], labels: list[int]) -> str:
    lines = [f"{'#':>5} {'id':>7}  loss  token"]
    for i, (token, label) in enumerate(zip(ids, labels, strict=True)):
        lines.append(f"{i:>5} {token:>7}  {'yes ' if label != IGNORED else '    '}  {tok.decode([token])!r}")
    return "\n".join(lines)
