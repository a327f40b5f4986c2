"""The data step's first half: each source loaded as the ranks will load it (data/sources.py), its shape found by
TRL's rules and its rows checked (data/checks.py). data.py runs it, then the checks that need the model's tokenizer
and the rows' tokens.

    beside(s, refused)    what of it can run while the settings themselves are refused, so that a bad setting and
                          bad data are named in one round (commands.py), not the data's problems after the fix
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..data import DataError, checks, shapes
from ..handoff import DataSource
from ..planner import data as data_rules
from ..planner.inputs import CannotRun, DataFacts
from ..settings import Settings
from ..settings.entries import looks_local, parse
from . import revisions

if TYPE_CHECKING:
    from datasets import Dataset

# The settings the checks beside a refusal read: where the refusal names one, it holds its default, not the user's
# value, and the checks that read it are left out (SFT_CONFIG's job file may hold any of them)
SOURCES = {"SFT_CONFIG", "SFT_DATASET", "SFT_DATASET_SPLIT"}
EVALUATION = {"SFT_EVAL_DATASET", "SFT_EVAL_SPLIT", "SFT_EVAL_FRACTION"}


def beside(s: Settings, refused: list[str]) -> list[str]:
    """The data's problems that can be found while the settings are refused (`refused`: their problems, each naming
    its variables): each local source of SFT_DATASET and of the evaluation read, its shape found and its rows checked,
    as the data step does. A check is left out where the refusal names a setting it reads (SOURCES, EVALUATION,
    SFT_LOSS_ON, SFT_EMPTY_ROWS). Hub datasets, and the checks that need the tokenizer or the tokens (the chat
    template, SFT_MAX_LENGTH's long rows, rows enough for a step), wait for the data step itself."""
    named = {var for problem in refused for var in _named(problem)}
    train = [] if named & SOURCES else [source(s, e) for e in parse(s.dataset) if looks_local(e.path)]
    if not train:
        return []
    quiet()
    problems: list[str] = []
    train, loaded = load(train, "SFT_DATASET", problems)
    shape = one_shape(loaded, train, "SFT_DATASET", problems)
    if shape is None:
        return problems
    loss = "all"  # with SFT_LOSS_ON refused: no check of what it asks of the rows
    if "SFT_LOSS_ON" not in named:  # its own check of the shape (the template's: the data step's)
        loss = loss_mode(s, DataFacts(shape.name, shape.conversational, shape.prompt_completion, tuple(train)),
                         problems)
    empty_rows = "drop" if "SFT_EMPTY_ROWS" in named else s.empty_rows  # drop: no row refused for teaching nothing
    problems += row_problems(of_shape(train, loaded, shape, "SFT_DATASET"), shape, loss, empty_rows)
    if not named & EVALUATION:
        held, _, _ = data_rules.evaluation(s, train)
        if held := [e for e in held if looks_local(e.path)]:
            evaluation(s, held, shape, loss, empty_rows, problems)
    return problems


def loss_mode(s: Settings, facts: DataFacts, problems: list[str]) -> str:
    """What the loss is computed on for these rows (planner/data.py's rule); where SFT_LOSS_ON cannot be, its problem
    is added to `problems` and the rows are still checked for what the user asked."""
    try:
        return data_rules.loss_mode(s.loss_on, facts)[0]
    except CannotRun as e:
        problems.append(str(e))
        return s.loss_on


def _named(problem: str) -> set[str]:
    """The settings a problem names. A value the job file gave is said after the file's place ("SFT_CONFIG='job.yaml':
    line 3, learning_rate: SFT_LEARNING_RATE='abc': ..."): that setting is refused, not the file, whose other values
    stand; a problem of the file's own (unreadable, an unknown key) names SFT_CONFIG alone."""
    found = set(re.findall(r"\bSFT_[A-Z0-9_]+", problem))
    return found - {"SFT_CONFIG"} if len(found) > 1 else found


def quiet() -> None:
    """datasets says nothing: the controller's log says what it read in one line, and a file it cannot read is
    said by the checks, in one line."""
    import logging

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)


def source(s: Settings, entry) -> DataSource:
    """One entry of SFT_DATASET as the ranks load it."""
    hub = not looks_local(entry.path)
    return DataSource(entry.path, s.dataset_split, config=s.dataset_config if hub else None,
                      revision=s.dataset_revision if hub else None, rows=entry.rows, weight=entry.weight)


def load(sources: list[DataSource], var: str, problems: list[str]) -> tuple[list[DataSource], list]:
    """The sources with each Hub dataset's revision made a commit, and each loaded (None where it could not
    be: its problem is added to `problems`)."""
    from ..data.sources import load as load_one

    resolved, loaded = [], []
    for src in sources:
        try:
            if not looks_local(src.path):
                src = dataclasses.replace(src, revision=revisions.resolve(src.path, "dataset", src.revision))
            resolved.append(src)
            if bad := _not_utf8(src):
                problems.extend(f"{var}: {line}" for line in bad)
                loaded.append(None)
                continue
            loaded.append(load_one(src, var))
        except revisions.RevisionError as e:
            problems.append(f"{var}: {e}")
            resolved.append(src)
            loaded.append(None)
        except DataError as e:
            problems.extend(e.problems)
            loaded.append(None)
    return resolved, loaded


def _not_utf8(src: DataSource) -> list[str]:
    """What a local source's files must not be when datasets reads them (data/files.py: not UTF-8, a first row that
    crashes pyarrow): said here, once, before it reads them."""
    from ..data.files import before_reading
    from ..settings.entries import Entry, is_data_file

    kind, path = Entry(src.path).kind, Path(os.path.expanduser(src.path))
    if kind == "file":
        return before_reading([path])
    if kind == "folder":
        return before_reading(sorted(p for p in path.rglob("*") if is_data_file(p) and p.is_file()))
    return []


def one_shape(loaded: list, sources: list[DataSource], var: str, problems: list[str]) -> shapes.Shape | None:
    """The one shape of the sources that loaded (None: none has one; the problems say why)."""
    found = {}
    for src, dataset in zip(sources, loaded, strict=True):
        if dataset is None:
            continue
        try:
            shape = shapes.shape_of(dataset)
        except UnicodeDecodeError as e:  # a Hub dataset's file that is not UTF-8 (local files are checked before)
            problems.append(f"{var}: {src.path}: its text is not UTF-8 ({e.reason} at byte {e.start}): save its "
                            "files as UTF-8")
            continue
        if shape is None:
            problems.append(f"{var}: {src.path}: {shapes.why_not(dataset)}")
        else:
            found[src.path] = shape
    problems += checks.shapes_differ(found, var)
    return next(iter(found.values()), None)


def row_problems(of_shape: list[tuple[str, Dataset]], shape: shapes.Shape, loss: str, empty_rows: str = "error"
                 ) -> list[str]:
    """The rows' problems, in each source that loaded with the shape (`of_shape`: the others' problem is said
    already)."""
    return [p for label, dataset in of_shape for p in checks.row_problems(dataset, shape, label, loss, empty_rows)]


def of_shape(sources: list[DataSource], loaded: list, shape: shapes.Shape, var: str) -> list[tuple[str, Dataset]]:
    """(its label, its rows) of each source that loaded with the shape."""
    return [(f"{var}: {src.path}", dataset) for src, dataset in zip(sources, loaded, strict=True)
            if dataset is not None and shapes.shape_of(dataset) == shape]


def evaluation(s: Settings, sources: list[DataSource], shape: shapes.Shape, loss: str, empty_rows: str,
               problems: list[str]) -> tuple[list[DataSource], list, list[tuple[str, Dataset]]]:
    """The evaluation's sources (SFT_EVAL_DATASET's, or SFT_EVAL_SPLIT's) loaded and checked as the training's,
    against the training's shape: (the sources, each loaded or None, the rows of that shape); every problem added to
    `problems`."""
    var = "SFT_EVAL_DATASET" if s.eval_dataset else "SFT_EVAL_SPLIT"
    sources, loaded = load(sources, var, problems)
    eval_shape = one_shape(loaded, sources, var, problems)
    if eval_shape is not None and eval_shape != shape:
        problems.append(f"{var}: the evaluation data is {eval_shape.name} and the training data {shape.name}: "
                        "evaluate on data of the training's shape")
    rows = of_shape(sources, loaded, shape, var)
    problems += row_problems(rows, shape, loss, empty_rows)
    return sources, loaded, rows
