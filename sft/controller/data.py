"""The data step, before any rank starts and before anything is written: resolve the Hub revisions, load every
source as the ranks will and check its rows (rowchecks.py), then what needs the tokenizer and the tokens. Every
problem is collected and raised at once as DataError, which the job reports like a settings problem (exit 2).

What it found, the DataFacts, is what the decision's data rules read (planner/data.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..data import DataError, checks, shapes
from ..data.empty import WHAT
from ..data.tokens import pad_note
from ..settings.entries import is_template_file, parse
from ..handoff import DataSource
from ..planner import data as data_rules
from ..planner import rules
from ..planner.inputs import DataFacts, Ranks
from ..settings import Settings
from . import rowchecks, template

if TYPE_CHECKING:
    from datasets import Dataset

    from ..data.longrows import LongRows
    from .tokens import Tokens


@dataclasses.dataclass
class Found:
    """The step's result: the facts for the decision, the log's lines, and what it loaded to find them."""

    facts: DataFacts
    notes: list[str]
    train: Dataset  # the training rows as the ranks draw them (evaluation rows held out)
    eval: Dataset | None = None
    tokenizer: object = None
    loss_on: str = "all"
    long_rows: LongRows | None = None  # the training rows longer than SFT_MAX_LENGTH (SFT_LONG_ROWS)
    empty_dropped: int = 0  # SFT_EMPTY_ROWS=drop: the training sources' rows that taught nothing, left out
    tokens: Tokens | None = None  # the training rows' tokens (before the long rows' drop): made here, or by a start


def read(s: Settings, ranks: Ranks) -> Found:
    """Load and check the training and evaluation data (raises DataError listing every problem)."""
    rowchecks.quiet()
    problems: list[str] = []
    train, loaded = rowchecks.load([rowchecks.source(s, e) for e in parse(s.dataset)], "SFT_DATASET", problems)
    shape = rowchecks.one_shape(loaded, train, "SFT_DATASET", problems)
    tok = _tokenizer(s, shape, problems)
    if shape is None:
        raise DataError(problems)
    facts = DataFacts(shape.name, shape.conversational, shape.prompt_completion, tuple(train),
                      marks_assistant=_marks(tok, s))
    loss = rowchecks.loss_mode(s, facts, problems)
    rows = rowchecks.of_shape(train, loaded, shape, "SFT_DATASET")
    problems += rowchecks.row_problems(rows, shape, loss, s.empty_rows)
    problems += template.tool_problems(s, tok, loss, shape, rows)
    evaluation = _eval_sources(s, facts, shape, loss, problems, tok)
    problems += template.problems(s, tok)
    if problems:
        raise DataError(problems)
    loaded, dropped = _without_empty(s, train, loaded, "SFT_DATASET")
    if evaluation is not None:
        evaluation = (evaluation[0], _without_empty(s, *evaluation, "SFT_EVAL_DATASET")[0])
    found = _assemble(s, facts, loaded, shape, evaluation)
    found.tokenizer, found.loss_on, found.empty_dropped = tok, loss, dropped
    found.notes += [note] if (note := pad_note(tok, s.extra_trainer_args)) else []
    if dropped:
        found.notes.append(f"data: SFT_DATASET: {dropped:,} row(s) teach nothing ({WHAT}) and are left out "
                           "(SFT_EMPTY_ROWS=drop)")
    found.notes += template.guarded(lambda: _token_checks(s, ranks, found), s, found)
    return found


def _without_empty(s: Settings, sources: list[DataSource], loaded: list, var: str) -> tuple[list, int]:
    """SFT_EMPTY_ROWS=drop: each source without its rows that teach nothing (as every rank loads it: sources.load_all),
    and how many were left out; a source left with none is a problem."""
    from ..data.empty import without

    if s.empty_rows != "drop":
        return loaded, 0
    kept = [without(d) for d in loaded]
    if none := [src.path for src, (d, gone) in zip(sources, kept, strict=True) if gone and len(d) == 0]:
        raise DataError([f"{var}: {path}: every row teaches nothing ({WHAT}), so SFT_EMPTY_ROWS=drop leaves none: "
                         "fill them, or remove the source" for path in none])
    return [d for d, _ in kept], sum(gone for _, gone in kept)


def _tokenizer(s: Settings, shape: shapes.Shape | None, problems: list[str]):
    """The model's tokenizer with SFT_CHAT_TEMPLATE, as the ranks will have it (None: a problem says why)."""
    from ..data.tokens import tokenizer
    from .inputs import model_revision

    try:
        tok = tokenizer(s.model, model_revision(s), s.chat_template, s.trust_remote_code)
    except Exception as e:  # not found, offline and not cached, a template model without a tokenizer
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        problems.append(f"SFT_MODEL={s.model!r}: cannot load its tokenizer ({why}): check the name or path, the "
                        "network, and HF_HUB_OFFLINE")
        return None
    if shape is not None and shape.conversational and not tok.chat_template:
        problems.append(f"SFT_MODEL={s.model!r}: its tokenizer has no chat template, and the data is {shape.name}: "
                        "set SFT_CHAT_TEMPLATE to a .jinja file or a model to take the template from")
    if shape is not None:
        problems += _special_tokens(s, tok, shape)
    return tok


def _special_tokens(s: Settings, tok, shape: shapes.Shape) -> list[str]:
    """The end-of-sequence and pad tokens TRL needs of the tokenizer, refused here rather than in every rank (an
    eos_token of SFT_TRAINER_ARGS is set on `tok` as TRL sets it, so the rows are tokenised with it)."""
    from ..data.tokens import special_tokens
    from ..settings.checks import shown_trainer_args

    cloned = s.chat_template is not None and not is_template_file(s.chat_template)
    unknown, no_eos = special_tokens(tok, s.extra_trainer_args, shape.conversational, cloned)
    if unknown:
        return [f"SFT_TRAINER_ARGS={shown_trainer_args(s.trainer_args or '')!r}: {' and '.join(unknown)}: not a token "
                f"of SFT_MODEL's tokenizer ({len(tok):,} tokens): name one of its tokens, such as {tok.eos_token!r}"]
    if not no_eos:
        return []
    use = ("pads with it, and it has no pad token either" if shape.conversational else
           f"ends each {'completion' if shape.prompt_completion else 'text'} with it")
    return [f"SFT_MODEL={s.model!r}: its tokenizer has no end-of-sequence token (eos_token), and TRL {use}: set "
            "eos_token in the model's tokenizer_config.json to one of its tokens (the one that ends a document or a "
            """turn), or SFT_TRAINER_ARGS='{"eos_token": "..."}'"""]


def _marks(tok, s: Settings) -> bool | None:
    from ..data.tokens import marks_assistant

    return marks_assistant(tok) if tok is not None and tok.chat_template and s.loss_on == "assistant" else None


def _eval_sources(s: Settings, facts: DataFacts, shape: shapes.Shape, loss: str, problems: list[str], tok=None):
    """SFT_EVAL_DATASET's or SFT_EVAL_SPLIT's sources, loaded and checked as the training's; (sources,
    datasets), or None when the evaluation rows are held out of the training rows, or there are none."""
    sources, _, _ = data_rules.evaluation(s, list(facts.train))
    if not sources:
        return None
    sources, loaded, rows = rowchecks.evaluation(s, sources, shape, loss, s.empty_rows, problems)
    problems += template.tool_problems(s, tok, loss, shape, rows)
    return sources, loaded


def _assemble(s: Settings, facts: DataFacts, loaded: list, shape: shapes.Shape, evaluation) -> Found:
    """The training rows as the ranks draw them, and the evaluation rows: held out of them, or the sources'."""
    from ..data.sources import combine, hold_out

    train = combine(loaded, list(facts.train), shape.columns, s.seed)
    _, fraction, why = data_rules.evaluation(s, list(facts.train))
    notes = [f"data: SFT_DATASET: {shape.name}, {len(train):,} rows from " + "; ".join(
        f.text() for f in facts.train)]
    facts = dataclasses.replace(facts, rows=len(train))
    if fraction > 0:
        if (problem := data_rules.held_out_problem(fraction, len(train))) is not None:
            raise DataError([problem])  # before datasets' own words for it ("Adjust any of the ...")
        kept, held = hold_out(train, fraction, s.seed)
        notes.append(f"data: evaluation: {len(held):,} rows, {why}")
        return Found(dataclasses.replace(facts, eval_rows=len(held)), notes, kept, held)
    if evaluation is None:
        return Found(facts, notes, train)
    sources, loaded_eval = evaluation
    rows = combine(loaded_eval, sources, shape.columns, s.seed)
    notes.append(f"data: evaluation: {len(rows):,} rows from " + "; ".join(f.text() for f in sources))
    return Found(dataclasses.replace(facts, eval=tuple(sources), eval_rows=len(rows)), notes, train, rows)


def _token_checks(s: Settings, ranks: Ranks, found: Found) -> list[str]:
    """The checks that need tokens: the rows longer than SFT_MAX_LENGTH (SFT_LONG_ROWS); enough rows for one
    optimizer step; with SFT_PACKING=false, not every evaluation row over SFT_MAX_LENGTH."""
    from ..data.tokens import Labeller

    labeller = Labeller(found.tokenizer, found.loss_on, s.max_length, _trainer_args(s))
    problems, notes, lengths = _long_rows(s, found, labeller)
    problems += _ids_beyond_the_model(s, found)
    train, evaluation = found.train, found.eval
    split, _, _ = rules.batch_split(s, None, ranks.on_gpu)  # a batch search keeps its rows per step
    seq = s.sequence_parallel if isinstance(s.sequence_parallel, int) else 1  # auto: as if unsplit (the most)
    groups = ranks.world // seq if ranks.world % seq == 0 else ranks.world
    needed = groups * split.rows
    per_step = (f"{ranks.world} rank(s)" if groups == ranks.world else
                f"{groups} data-parallel group(s) of {seq} rank(s)") + (
        f" x micro-batch {split.micro_batch} x accumulation {split.grad_accum}")
    if s.packing:
        problems += checks.too_few_packed(train, lengths, labeller, needed, per_step, "SFT_DATASET", ranks.on_gpu)
    else:
        problems += checks.too_few_rows(len(train), needed, per_step, "SFT_DATASET", ranks.on_gpu)
        if evaluation is not None and len(evaluation):
            long, note = checks.all_too_long(evaluation, labeller, "evaluation")
            problems, notes = problems + long, notes + ([note] if note else [])
    if problems:
        raise DataError(problems)
    return notes


def _ids_beyond_the_model(s: Settings, found: Found) -> list[str]:
    """Token ids the model has no embedding for (a tokenizer with more tokens than config.json's vocab_size): every
    rank would fail at its first step with an IndexError that names neither."""
    from ..data import cache

    vocab = _model_vocab(s)
    top = cache.largest_id(found.tokens.rows) if vocab is not None else None
    if top is None or top < vocab:
        return []
    return [f"SFT_MODEL={s.model!r}: its tokenizer gives this data token ids up to {top:,} ({len(found.tokenizer):,} "
            f"tokens in all), but its config.json's vocab_size is {vocab:,}: the model has no embedding for ids "
            f"{vocab:,} and up. Use the tokenizer the model was trained with, or resize its embeddings "
            "(resize_token_embeddings) and save it"]


def _model_vocab(s: Settings) -> int | None:
    """The model's embedding rows (its config's vocab_size); None where the config cannot be read (named elsewhere)."""
    from transformers import AutoConfig

    from .inputs import model_revision

    try:
        config = AutoConfig.from_pretrained(s.model, revision=model_revision(s), trust_remote_code=s.trust_remote_code)
        return int(config.get_text_config().vocab_size)
    except Exception:  # noqa: BLE001 - not found, offline, not a model's config: the model's own checks say so
        return None


def _long_rows(s: Settings, found: Found, labeller) -> tuple[list[str], list[str], list[int]]:
    """(problems, notes, the tokens of each row of found.train) of SFT_LONG_ROWS: every training row counted once,
    here; drop leaves the long ones out of found.train and names their positions in the facts, so the ranks leave
    out the same rows."""
    from ..data import cache, longrows
    from . import tokens

    found.tokens = tokens.find(s, found.train, list(found.facts.train), labeller)
    lengths = cache.lengths(found.tokens.rows)
    if none := [i for i, n in enumerate(lengths) if n == 0]:  # packed, they fail in pyarrow, far from the cause
        raise DataError([f"{template.owner(s)}: its chat template renders {checks.rows_named(none)} of the training "
                         "rows as no token at all, which teaches nothing: fix the template (does it loop over "
                         "messages?), or remove the rows"])
    found.long_rows = longrows.count(lengths, s.max_length, s.long_rows)
    if (problem := found.long_rows.problem(s.packing, _in_order(s, found))) is not None:
        return [problem], [found.tokens.line()], lengths
    if s.long_rows == "drop" and found.long_rows.longer:
        drop = longrows.dropped(lengths, s.max_length)
        found.train = longrows.without(found.train, drop)
        found.facts = dataclasses.replace(found.facts, dropped=tuple(drop))
        gone = set(drop)
        lengths = [n for i, n in enumerate(lengths) if i not in gone]
    return [], [found.tokens.line(), found.long_rows.line()], lengths


def _in_order(s: Settings, found: Found) -> str:
    """The one source whose rows the training rows are, in its order (no amount drawn, no row held out or left out),
    so a training row's place is its row there; '' where they are not."""
    (one, *more) = found.facts.train
    alone = not more and one.rows is None and one.weight is None
    return one.path if alone and s.eval_fraction == 0 and not found.empty_dropped else ""


def _trainer_args(s: Settings) -> dict:
    import json

    return json.loads(s.trainer_args or "{}")


def summary(found: Found | None, plan) -> dict | None:
    """What the run trained and evaluated on, for run/summary.json and the model card."""
    if found is None or plan is None:
        return None
    long_rows = {"long_rows": found.long_rows.to_dict()} if found.long_rows is not None else {}
    tokens = {"tokens": found.tokens.to_dict()} if found.tokens is not None else {}
    return {"shape": found.facts.shape, "train_rows": len(found.train), "eval_rows": found.facts.eval_rows,
            **long_rows, **tokens, **({"empty_rows_dropped": found.empty_dropped} if found.empty_dropped else {}),
            **{k: v for k, v in plan.to_dict().items() if k not in ("dropped", "tokens")}}
