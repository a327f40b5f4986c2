"""Where the rows come from, loaded with `datasets`: a file, a folder of files, a save_to_disk folder, a Hub
dataset (config, revision); several drawn into one mixture; evaluation rows held out of it.

The controller (controller/data.py) and every rank (`build`) make the rows with the same functions:

    load_all(sources)     each source with datasets' own loaders (every source's problems at once)
    combine(...)          the shape's columns of each, its rows drawn as its amount says, concatenated
    hold_out(...)         SFT_EVAL_FRACTION of the rows, by datasets' seeded train_test_split

A mixture is a pure function of the sources, their amounts and the seed: each start draws the same rows
in the same order, so a resume continues the same epoch (the Trainer shuffles with its own seed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..handoff import DataPlan, DataSource
from . import alpaca, files, system
from .shapes import SHAREGPT, Shape
from ..settings.entries import LOADERS, Entry, data_suffix, is_data_file
from . import DataError

if TYPE_CHECKING:
    from datasets import Dataset

OPTIONAL_COLUMNS = ("tools", "chat_template_kwargs")  # per-row extras TRL's tokenisation reads


def build(plan: DataPlan) -> tuple[Dataset, Dataset | None]:
    """The training rows and the evaluation rows (None: no evaluation), as the plan says. With the data step's tokens
    (plan.tokens) the training rows are those, which SFTTrainer truncates or packs without tokenising them again;
    the sources are read only for rows held out of them."""
    from datasets import load_from_disk

    from .longrows import without
    from .shapes import shape_of

    # TRL refuses assistant_only_loss on rows already tokenised ("the dataset is not conversational"): those
    # rows are tokenised by SFTTrainer itself, as before the data step kept its tokens
    tokens = plan.tokens if plan.loss_on != "assistant" else ""
    train = held = None
    if plan.eval_fraction > 0 or not tokens:
        loaded = load_all(plan.train, "SFT_DATASET", plan.drop_empty)
        train = combine(loaded, plan.train, shape_of(loaded[0]).columns, plan.seed)
    if plan.eval_fraction > 0:
        train, held = hold_out(train, plan.eval_fraction, plan.seed)
    elif plan.eval:
        evaluation = load_all(plan.eval, "SFT_EVAL_DATASET", plan.drop_empty)
        held = combine(evaluation, plan.eval, shape_of(evaluation[0]).columns, plan.seed)
    if tokens:
        train = load_from_disk(tokens)
    return without(train, plan.dropped), held


def load_all(sources: list[DataSource], var: str, drop_empty: bool = False) -> list[Dataset]:
    """Every source loaded (without its rows that teach nothing, with drop_empty: empty.py); raises DataError with
    every source's problem."""
    from .empty import without

    loaded, problems = [], []
    for source in sources:
        try:
            dataset = load(source, var)
            loaded.append(without(dataset)[0] if drop_empty else dataset)
        except DataError as e:
            problems += e.problems
    if problems:
        raise DataError(problems)
    return loaded


def load(source: DataSource, var: str = "SFT_DATASET") -> Dataset:
    """One source's split as a Dataset (raises DataError with one line naming it and what is wrong); Alpaca's rows
    as conversational prompt/completion (alpaca.py); a system column as the conversations' first turn (system.py)."""
    dataset, label = _load(source, var), f"{var}: {source.path}"
    return alpaca.as_prompt_completion(dataset, label) if alpaca.is_alpaca(dataset) else system.folded(dataset, label)


def _load(source: DataSource, var: str) -> Dataset:
    import datasets

    label = f"{var}: {source.path}"
    kind = Entry(source.path).kind
    try:
        if kind == "saved":
            return _saved(source, label)
        if kind == "hub":
            return datasets.load_dataset(source.path, source.config, split=source.split, revision=source.revision)
        path = Path(os.path.expanduser(source.path))
        if kind == "file":
            return datasets.load_dataset(LOADERS[data_suffix(path)], data_files=str(path), split=source.split)
        if unread := _unread(path):
            raise DataError([f"{label}: datasets reads only its files named for splits (train, test, ...), and "
                             f"would leave out {len(unread)}: {', '.join(p.name for p in unread[:3])}"
                             f"{' ...' if len(unread) > 3 else ''}: name every file for its split, or none"])
        return datasets.load_dataset(str(path), split=source.split)  # datasets names the splits from the files
    except DataError:
        raise
    except Exception as e:  # datasets raises many kinds: each becomes one line a user can act on
        raise DataError(_why(e, source, kind, label, var)) from None


def _unread(folder: Path) -> list[Path]:
    """Data files of a folder that datasets' split naming leaves out: once one file is named for a split, the
    others are silently not read."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    splits = DataFilesDict.from_patterns(get_data_patterns(str(folder)), base_path=str(folder))
    read = {Path(f).resolve() for files in splits.values() for f in files}
    hidden = (".", "__")  # datasets skips these files and folders too
    return sorted(p for p in folder.rglob("*") if is_data_file(p) and p.resolve() not in read
                  and not any(part.startswith(hidden) for part in p.relative_to(folder).parts))


def _saved(source: DataSource, label: str) -> Dataset:
    from datasets import DatasetDict, load_from_disk

    found = load_from_disk(str(Path(os.path.expanduser(source.path))))
    if not isinstance(found, DatasetDict):
        if source.split != "train":
            raise DataError([f"{label}: a save_to_disk Dataset is one split, not {source.split!r}; save a "
                             "DatasetDict to have splits, or use SFT_EVAL_FRACTION"])
        return found
    if source.split not in found:
        raise DataError([f"{label}: no split {source.split!r} (its splits: {', '.join(found)})"])
    return found[source.split]


def _why(error: Exception, source: DataSource, kind: str, label: str, var: str) -> list[str]:
    text = str(error).strip() or type(error).__name__
    if "Unknown split" in text:
        if kind != "file":
            return [f"{label}: no split {source.split!r}: {text.splitlines()[0]}"]
        fix = ("hold evaluation rows out with SFT_EVAL_FRACTION, or give a file of them in SFT_EVAL_DATASET" if
               var == "SFT_EVAL_SPLIT" else "leave the split unset, or give a folder whose files are named for their "
               "splits (train.jsonl, test.jsonl)")
        return [f"{label}: no split {source.split!r} (a single file is the one split 'train'): {fix}"]
    if kind in ("file", "folder"):
        path = Path(os.path.expanduser(source.path))
        paths = [path] if kind == "file" else sorted(p for p in path.rglob("*") if is_data_file(p))
        if found := files.diagnose(paths):
            return [f"{var}: {line}" for line in found]
    cause = f" ({str(error.__cause__).splitlines()[0]})" if error.__cause__ and str(error.__cause__) else ""
    if kind == "folder" and "column names don't match" in str(error.__cause__):  # datasets reads a folder as one table
        return [f"{label}: cannot be read: its files have different columns (datasets reads a folder's files as one "
                "table): name the files in SFT_DATASET, separated by commas (a mixture takes its shape's columns "
                "of each), or give them the same columns"]
    if kind == "hub":
        return [f"{label}: cannot be loaded from the Hub: {text.splitlines()[0]}{cause}: check the name "
                "(SFT_DATASET_CONFIG for its subsets), HF_TOKEN for a gated or private dataset, and with "
                "HF_HUB_OFFLINE=1 that it is in the cache (HF_HOME)"]
    return [f"{label}: cannot be read: {text.splitlines()[0]}{cause}"]


def combine(loaded: list[Dataset], sources: list[DataSource], columns: tuple[str, ...], seed: int) -> Dataset:
    """One dataset: of each source its shape's columns and the rows its amount asks for, concatenated."""
    from datasets import concatenate_datasets

    # kept where any source has one (a mixture's tool rows keep their tools' definitions): None in the others' rows
    extras = [c for c in OPTIONAL_COLUMNS if any(c in d.column_names for d in loaded)]
    parts = []
    for index, (dataset, source) in enumerate(zip(loaded, sources, strict=True)):
        for column in extras:
            if column not in dataset.column_names:
                dataset = dataset.add_column(column, [None] * len(dataset))
        dataset = dataset.select_columns([*columns, *extras])
        if columns == SHAREGPT.columns:
            dataset = with_roles(dataset, SHAREGPT)
        parts.append(draw(dataset, wanted_rows(source, len(dataset)), seed, index))
    if len(parts) == 1:
        return parts[0]
    return concatenate_datasets(_typed_alike(parts, sources))


def _typed_alike(parts: list[Dataset], sources: list[DataSource]) -> list[Dataset]:
    """The sources' rows in one set of column types. JSON, Parquet and CSV can type the same column differently
    (string or large string), and messages whose keys differ (tool calls in some) are JSON text where plain ones
    are structs: a struct casts to JSON, not back, so each source's types are tried in turn as the common ones."""
    errors, tried = [], []
    for target in (p.features for p in parts):  # in the sources' order
        if target in tried:
            continue
        tried.append(target)
        try:
            return [p if p.features == target else p.cast(target) for p in parts]
        except (TypeError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            errors.append(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    names = ", ".join(s.path for s in sources)
    raise DataError([f"SFT_DATASET: its sources ({names}) type the same columns differently, and no source's "
                     f"types hold the others' ({errors[0]}): give their rows the same keys, or train on them "
                     "separately"])


def with_roles(dataset: Dataset, shape: Shape) -> Dataset:
    """The shape's own role names given as the chat template knows them (ShareGPT's human -> user, gpt ->
    assistant: shapes.SHAREGPT_ROLES), the rest of each message as it was; held in memory, nothing written."""
    names, key = shape.roles, shape.role_key

    def renamed(batch: dict) -> dict:
        return {column: [[{**m, key: names.get(m.get(key), m.get(key))} if isinstance(m, dict) else m for m in rows]
                         if rows is not None else rows for rows in batch[column]] for column in shape.message_columns}

    return dataset.map(renamed, batched=True, keep_in_memory=True, desc="ShareGPT's roles")


def wanted_rows(source: DataSource, available: int) -> int:
    if source.rows is not None:
        return source.rows
    if source.weight is not None:
        return max(1, round(source.weight * available))
    return available


def draw(dataset: Dataset, rows: int, seed: int, index: int) -> Dataset:
    """`rows` rows of the dataset: all of them in order, a seeded sample, or every row repeated and a seeded
    sample for the rest. datasets has no sampling with repetition, hence this."""
    import numpy as np

    if rows == len(dataset):
        return dataset
    order = np.random.default_rng([seed, index]).permutation(len(dataset))  # one stream per source
    repeats, rest = divmod(rows, len(dataset))
    indices = np.concatenate([np.tile(np.arange(len(dataset)), repeats), np.sort(order[:rest])])
    return dataset.select(indices, keep_in_memory=True)


def hold_out(dataset: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """(training rows, evaluation rows): `fraction` of the rows, the same ones for the same seed."""
    # its indices go to the cache beside the data (keep_in_memory fails there on data that has cache files)
    parts = dataset.train_test_split(test_size=fraction, seed=seed)
    return parts["train"], parts["test"]
