"""The data's choices, each a pure rule returning its value and the reason: which tokens carry the loss,
what the model is evaluated on and how often. The facts they read (the data's shape, whether the chat
template can mark the assistant's turns) are the controller's (controller/data.py)."""

from __future__ import annotations

import dataclasses
import math

from .. import exitcodes
from ..settings.entries import parse
from ..data.tokens import processes
from ..handoff import DataPlan, DataSource
from ..settings import Settings
from .inputs import CannotRun, DataFacts


def plan(s: Settings, facts: DataFacts) -> tuple[DataPlan, dict[str, str]]:
    """The data plan the ranks carry out, and the reasons: 'loss' and 'evaluation'."""
    loss, why_loss = loss_mode(s.loss_on, facts)
    _, fraction, why_eval = evaluation(s, list(facts.train))
    every, why_every = eval_every(s, bool(facts.eval) or fraction > 0)
    data = DataPlan(train=list(facts.train), eval=list(facts.eval), eval_fraction=fraction, eval_steps=every,
                    loss_on=loss, seed=s.seed, dropped=list(facts.dropped), processes=processes(facts.rows),
                    drop_empty=s.empty_rows == "drop")
    return data, {"loss": why_loss, "evaluation": why_eval + (f"; {why_every}" if why_every else "")}


def loss_mode(asked: str, facts: DataFacts) -> tuple[str, str]:
    """all, assistant or completion (raises CannotRun where the data or the chat template cannot have it)."""
    if asked == "auto":
        if facts.prompt_completion:
            return "completion", "completion, auto: prompt/completion data learns its completions (TRL's default)"
        return "all", f"all tokens, auto: {facts.shape} data learns every token (TRL's default, the seed's recipe)"
    if asked == "assistant":
        if not facts.conversational:
            raise CannotRun(f"SFT_LOSS_ON=assistant needs conversations, and this data is {facts.shape}: use "
                            "completion (prompt/completion data) or all", exitcodes.BAD_SETTINGS)
        if facts.marks_assistant is False:
            raise CannotRun("SFT_LOSS_ON=assistant: the model's chat template cannot mark the assistant's tokens "
                            "(no {% generation %} markers, and TRL has no training version of it): set "
                            "SFT_CHAT_TEMPLATE to a .jinja file with {% generation %}...{% endgeneration %} around "
                            "each assistant turn (or a model whose template has them), or use SFT_LOSS_ON=all",
                            exitcodes.BAD_SETTINGS)
        return "assistant", "assistant turns only (SFT_LOSS_ON)"
    if asked == "completion" and not facts.prompt_completion:
        raise CannotRun(f"SFT_LOSS_ON=completion needs prompt/completion data, and this data is {facts.shape}: use "
                        "assistant (conversations) or all", exitcodes.BAD_SETTINGS)
    return asked, f"{asked} (SFT_LOSS_ON)" if asked == "completion" else "all tokens (SFT_LOSS_ON)"


def evaluation(s: Settings, train: list[DataSource]) -> tuple[list[DataSource], float, str]:
    """(evaluation sources, fraction of the training rows held out, why): at most one of the two."""
    if s.eval_dataset:
        split = s.eval_split or "train"
        sources = [DataSource(e.path, split, rows=e.rows, weight=e.weight) for e in parse(s.eval_dataset)]
        return sources, 0.0, f"SFT_EVAL_DATASET, split {split!r}"
    if s.eval_split:
        sources = [dataclasses.replace(t, split=s.eval_split, rows=None, weight=None) for t in train]
        return sources, 0.0, f"the {s.eval_split!r} split of SFT_DATASET (SFT_EVAL_SPLIT), every row"
    if s.eval_fraction > 0:
        return [], s.eval_fraction, (f"{s.eval_fraction:g} of the training rows held out (SFT_EVAL_FRACTION), drawn "
                                     f"with seed {s.seed}: the same rows on every start")
    return [], 0.0, "none (SFT_EVAL_DATASET, SFT_EVAL_SPLIT and SFT_EVAL_FRACTION unset)"


def eval_every(s: Settings, evaluates: bool) -> tuple[int | None, str]:
    if not evaluates:
        return None, ""
    if s.eval_steps is not None:
        return s.eval_steps, f"every {s.eval_steps} steps (SFT_EVAL_STEPS) and at the end"
    if s.save_steps is not None:
        return s.save_steps, f"every {s.save_steps} steps, with each checkpoint (SFT_SAVE_STEPS), and at the end"
    # None: the ranks evaluate with each checkpoint saved by time (sft/ranks/cadence.py), and at the end
    return None, f"with each checkpoint (every {s.save_seconds / 60:g} min of training) and at the end"


def held_out_problem(fraction: float, rows: int) -> str | None:
    """Why SFT_EVAL_FRACTION cannot split `rows` rows, both sides keeping a row (None: it can). datasets'
    train_test_split holds out fraction x rows rounded up, so any fraction above 0 holds out one row at least."""
    if math.ceil(fraction * rows) < rows:
        return None
    said = f"SFT_EVAL_FRACTION={fraction:g} holds out {math.ceil(fraction * rows):,} of the {rows:,} training rows " \
           "(rounded up), leaving none to train on: "
    if rows < 2:
        return said + "one row cannot be split: give more rows, or evaluation rows of their own in SFT_EVAL_DATASET"
    most = math.floor((rows - 1) / rows * 10_000) / 10_000  # shown rounded down: still below (rows - 1) / rows
    return said + f"with {rows:,} rows a fraction above 0 and at most {most:g} keeps a row on both sides"
