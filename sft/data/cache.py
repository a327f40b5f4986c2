"""The training rows' tokens, made once: the data step tokenises every training row to count its length, and keeps
what it made in OUTPUT/run/tokens/ (a datasets save_to_disk folder: input_ids and labels); the ranks train on it and a
restart reuses it, so no start tokenises twice and a resume tokenises nothing.

What is kept is each row as TRL's SFTTrainer tokenises and labels it (tokens.Labeller.tokenise), before truncation and
packing: the ranks hand it to SFTTrainer, whose preparation sees "input_ids" and skips its own tokenisation, then
truncates or packs it to SFT_MAX_LENGTH as it would have (TRL's _prepare_dataset, is_processed). So SFT_MAX_LENGTH,
SFT_PACKING and SFT_LONG_ROWS do not change what is kept and are not in its key: a start with another length reuses
the tokens and cuts them anew. Rows SFT_LONG_ROWS=drop leaves out are left out by position, as before.

The key written beside them (key.json) holds everything the tokens are a function of; any difference and they are
made again:
    rows        the training rows' datasets fingerprint: datasets' own identity of a dataset, made from its files
                (a local file by path and modification time, a Hub dataset by its commit) and every operation on
                them (the mixture's draws, the held-out rows, SFT_EMPTY_ROWS=drop), the same in every process
    files       each local source file's sha256: a file rewritten with the same modification time is still new
    tokenizer   the sha256 of the tokenizer as saved (save_pretrained: its vocabulary, added tokens, special tokens
                and chat template, SFT_CHAT_TEMPLATE's included): whatever the model's revision or folder
    labels      the loss mode and the training template that marks the assistant's tokens, the text field
    code        VERSION below, and the versions of TRL, transformers, tokenizers and datasets
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..settings.entries import Entry, is_data_file

if TYPE_CHECKING:
    from datasets import Dataset

    from ..handoff import DataSource
    from .tokens import Labeller

VERSION = 1  # what is kept and how it is made (columns, Labeller.tokenise): a change here makes every cache stale
FOLDER = "tokens"  # under OUTPUT/run/
KEY_FILE = "key.json"
# what datasets itself writes into a save_to_disk folder as it works on it (the held-out rows' indices, say): not the
# data, and not there on the first start
DATASETS_OWN = ("cache-", "tmp")


def key(rows: Dataset, sources: list[DataSource], labeller: Labeller) -> dict[str, Any]:
    """Everything the training rows' tokens are a function of (the module's docstring says why each)."""
    from importlib.metadata import version

    return {
        "version": VERSION,
        "libraries": {name: version(name) for name in ("trl", "transformers", "tokenizers", "datasets")},
        "rows": rows._fingerprint, "count": len(rows),
        "files": {str(p): _sha256(p) for p in _local_files(sources)},
        "tokenizer": _tokenizer_hash(labeller.tok),
        "loss_on": labeller.loss_on,
        "training_template": labeller.trainer.chat_template,
        "dataset_text_field": labeller.args.dataset_text_field,
    }


def load(folder: Path, wanted: dict[str, Any]) -> Dataset | None:
    """The kept tokens, when their key is `wanted` (None: none kept, another key, or not readable)."""
    from datasets import load_from_disk

    try:
        if json.loads((folder / KEY_FILE).read_text()) != json.loads(json.dumps(wanted)):
            return None
        return load_from_disk(str(folder))
    except (OSError, ValueError, FileNotFoundError):  # none yet, a torn key, a folder datasets cannot read
        return None


def save(tokens: Dataset, folder: Path, wanted: dict[str, Any]) -> None:
    """Keep the tokens in `folder` with their key, replacing what was there. Built under a temporary name and renamed
    when whole, the key written last: a start killed mid-way leaves nothing that a later start trusts."""
    building = folder.with_name(f".{folder.name}-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    try:
        tokens.save_to_disk(str(building))
        (building / KEY_FILE).write_text(json.dumps(wanted, indent=1))
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)  # a full disk keeps no part of it
        raise
    shutil.rmtree(folder, ignore_errors=True)
    building.rename(folder)


def lengths(tokens: Dataset) -> list[int]:
    """Each row's tokens, read from Arrow's list lengths (no row is decoded into Python)."""
    import pyarrow.compute as pc

    return pc.list_value_length(_ids(tokens)).to_pylist()


def largest_id(tokens: Dataset) -> int | None:
    """The largest token id in any row (None: no tokens), by Arrow's kernels over the flattened lists."""
    import pyarrow.compute as pc

    return pc.max(pc.list_flatten(_ids(tokens))).as_py()


def _ids(tokens: Dataset):
    """The input_ids column as Arrow holds it, a selection's rows gathered first."""
    table = tokens.flatten_indices().data if tokens._indices is not None else tokens.data
    return table.column("input_ids")


STAGING = "sft-tokens-"  # TMPDIR/sft-tokens-XXXXXXXX: one process's tokens not yet kept
HELD = ".held"  # in it: a file its process holds a flock(2) on while it runs (the kernel drops it however it dies)
_held: list = []  # the open lock files: a lock lives as long as its descriptor


def staging() -> Path:
    """A private folder for tokens not yet kept (the data step writes nothing in the output folder before its checks
    pass and the folder's lock is held); removed when the process ends. One that a killed process left (kill -9 runs
    no exit handler, and a restarted container keeps its /tmp) is removed by the next start: nothing holds its lock.
    A lock, not a pid: a container's job has the same pid at every start."""
    root = Path(tempfile.gettempdir())
    for left in root.glob(f"{STAGING}*"):
        _remove_if_left(left)
    folder = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
    taking = folder / f"{HELD}-taking"
    holder = open(taking, "w")  # noqa: SIM115 - held open until the process ends
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    taking.rename(folder / HELD)  # seen by others only once held
    _held.append(holder)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _remove_if_left(folder: Path) -> None:
    """`folder` removed where no process holds its lock; kept where one does, or where it has no lock file (one
    being made, or an older version's: whose it is cannot be told)."""
    try:
        with open(folder / HELD) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), no lock file, or not ours to read
        return
    shutil.rmtree(folder, ignore_errors=True)


def _local_files(sources: list[DataSource]) -> list[Path]:
    found = []
    for src in sources:
        kind, path = Entry(src.path).kind, Path(os.path.expanduser(src.path))
        if kind == "file":
            found.append(path)
        elif kind in ("folder", "saved"):
            found += sorted(p for p in path.rglob("*") if p.is_file() and (
                is_data_file(p) if kind == "folder" else not p.name.startswith(DATASETS_OWN)))
    return found


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _tokenizer_hash(tok) -> str:
    """The tokenizer as save_pretrained writes it: every file it depends on, whatever folder or revision it came
    from."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="sft-tokenizer-") as folder:
        tok.save_pretrained(folder)
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
