"""The training data: a Hub dataset or local files, conversational ("messages" column)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

# datasets' loader name for each local file format.
LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
DATA_SUFFIXES = tuple(LOADERS)


def looks_local(value: str) -> bool:
    """A path the user meant as local: it exists, or is written like a path (/x, ./x, ~/x)."""
    return os.path.exists(os.path.expanduser(value)) or value.startswith(("/", ".", "~"))


class DataError(Exception):
    """The dataset loaded but cannot be trained on as it is."""


def load_conversations(name: str, split: str) -> Dataset:
    """Load the dataset and check it holds conversations TRL can apply a chat template to."""
    dataset = _load(name, split)
    if "messages" not in dataset.column_names:
        raise DataError(f"SFT_DATASET={name!r}: expected a 'messages' column of conversations "
                        f"(found columns: {', '.join(dataset.column_names)})")
    if len(dataset) == 0:
        raise DataError(f"SFT_DATASET={name!r} split {split!r}: no rows")
    return dataset


def _load(name: str, split: str) -> Dataset:
    from datasets import load_dataset

    if not looks_local(name):
        return load_dataset(name, split=split)
    path = Path(name).expanduser()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in DATA_SUFFIXES)
    if not files:
        raise DataError(f"SFT_DATASET={name!r}: no {', '.join(DATA_SUFFIXES)} files in this folder")
    loaders = {LOADERS[p.suffix] for p in files}
    if len(loaders) > 1:
        raise DataError(f"SFT_DATASET={name!r}: mixes JSON and Parquet files; keep one format per folder")
    # All local files form one split: a folder of shards is one dataset.
    return load_dataset(loaders.pop(), data_files=[str(p) for p in files], split="train")
