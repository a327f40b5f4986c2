"""The first rows as the model sees them, for `entrypoint.py data`: the text of their tokens, with the tokens
that carry the loss between ⟦ and ⟧ (or one token a line with --tokens). The labels are TRL's (tokens.py).
A long row is shown as its start and its end, with the length of what is left out between them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .tokens import IGNORED, Labeller, in_memory

if TYPE_CHECKING:
    from datasets import Dataset

OPEN, CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧: brackets no chat template or dataset is likely to hold

# A row is shown whole up to SHOWN characters (or SHOWN_TOKENS lines with --tokens); a longer one, such as a document
# of 200,000 characters that would flood the terminal, as its first HEAD and its last SHOWN - HEAD: the start shows
# how the template opens a row, the end the last turn and where the loss stops.
SHOWN, HEAD = 4_000, 3_000
SHOWN_TOKENS, HEAD_TOKENS = 400, 300


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
        out.append(_tokens(labeller.tok, ids, labels) if per_token else excerpt(_spans(labeller.tok, ids, labels)))
    return "\n".join(out)


def learned_labels(labels: list[int]) -> list[int]:
    """TRL's labels as the loss uses them: the first token is never predicted (the model shifts the labels by
    one; packed, TRL's collator masks each sequence's first token)."""
    return [IGNORED, *labels[1:]] if labels else labels


def excerpt(text: str) -> str:
    """The text whole, or for one over SHOWN characters its first HEAD and last SHOWN - HEAD, the rest counted."""
    if len(text) <= SHOWN:
        return text
    return f"{text[:HEAD]}\n… [{len(text) - SHOWN:,} characters left out] …\n{text[HEAD - SHOWN:]}"


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
    """One line a token; over SHOWN_TOKENS tokens, the first HEAD_TOKENS and the last SHOWN_TOKENS - HEAD_TOKENS."""
    def line(i: int) -> str:
        return f"{i:>5} {ids[i]:>7}  {'yes ' if labels[i] != IGNORED else '    '}  {tok.decode([ids[i]])!r}"

    header, cut = f"{'#':>5} {'id':>7}  loss  token", len(ids) - SHOWN_TOKENS  # cut: the tokens left out
    if cut <= 0:
        return "\n".join([header, *map(line, range(len(ids)))])
    return "\n".join([header, *map(line, range(HEAD_TOKENS)),
                      f"    … [{cut:,} tokens left out: #{HEAD_TOKENS} to #{HEAD_TOKENS + cut - 1}] …",
                      *map(line, range(HEAD_TOKENS + cut, len(ids)))])
