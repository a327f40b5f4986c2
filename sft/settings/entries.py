"""What SFT_DATASET (and SFT_EVAL_DATASET) says: one source or several, comma-separated, each a local path or a
Hub name, with an optional amount after a colon:

    demo/chat.jsonl                       every row once
    demo/chat.jsonl:300                   300 rows drawn from it (seeded; more than it holds repeats rows)
    org/name:0.5, /data/more:2.0          a weight (a decimal point): half of org/name's rows, more's twice

Nothing here reads a file (it only asks whether a path exists and what it holds), so the settings check these
values before anything is loaded; sft/data/ loads what they name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .names import hub_name_problem, not_a_name
from .system import is_system

# datasets' builder for each local file format
LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
DATA_SUFFIXES = tuple(LOADERS)
# The text formats compressed (rows.jsonl.gz): datasets decompresses them before its builder reads (its extract
# step; zstd would need the zstandard package, which the image does not have). Parquet compresses inside.
COMPRESSIONS = (".gz", ".bz2", ".xz")
TEXT_SUFFIXES = (".jsonl", ".json", ".csv")  # the text formats: read as UTF-8 (data/files.py), may be compressed
FORMATS_SAID = f"{', '.join(DATA_SUFFIXES)} file (the text ones may end in {', '.join(COMPRESSIONS)})"


def data_suffix(path: str | Path) -> str:
    """The format's suffix of a data file: '.jsonl' for rows.jsonl and rows.jsonl.gz; '' for any other file."""
    path = Path(path)
    if path.suffix in COMPRESSIONS:
        inner = Path(path.stem).suffix
        return inner if inner in TEXT_SUFFIXES else ""
    return path.suffix if path.suffix in DATA_SUFFIXES else ""


def is_data_file(path: str | Path) -> bool:
    return data_suffix(path) != ""


# What datasets' save_to_disk writes: a Dataset (both files) or a DatasetDict.
SAVED_DATASET = ("dataset_info.json", "state.json")
SAVED_DICT = "dataset_dict.json"
AMOUNT = re.compile(r"^(?P<path>.+?):(?P<amount>\d+|\d*\.\d+)$")


TEMPLATE_SUFFIXES = (".jinja", ".j2")  # SFT_CHAT_TEMPLATE: a template file (TRL reads any other value as a tokenizer's)


def is_template_file(value: str) -> bool:
    """SFT_CHAT_TEMPLATE names a template file, read as it is, not a model to clone the template from."""
    return value.endswith(TEMPLATE_SUFFIXES)


def looks_local(value: str) -> bool:
    """A path the user meant as local: it exists, or is written like a path (/x, ./x, ~/x)."""
    return os.path.exists(os.path.expanduser(value)) or value.startswith(("/", ".", "~"))


@dataclass(frozen=True)
class Entry:
    """One source as written: where, and how many of its rows (rows, or weight x its rows; neither: all)."""

    path: str
    rows: int | None = None
    weight: float | None = None

    @property
    def local(self) -> bool:
        return looks_local(self.path)

    @property
    def kind(self) -> str:
        """file, folder (of files), saved (save_to_disk) or hub."""
        if not self.local:
            return "hub"
        path = Path(os.path.expanduser(self.path))
        if os.path.isfile(path):  # os.path: False for a name Linux cannot hold, where pathlib raises
            return "file"
        if os.path.isfile(path / SAVED_DICT) or all(os.path.isfile(path / name) for name in SAVED_DATASET):
            return "saved"
        return "folder"


def parse(value: str) -> list[Entry]:
    """The entries of a comma-separated value (raises ValueError naming the entry that is wrong)."""
    entries = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            raise ValueError("an empty entry (two commas, or a comma at an end)")
        m = AMOUNT.match(part)
        if m is None:
            entries.append(Entry(part))
        elif "." in m["amount"]:
            if float(m["amount"]) <= 0:
                raise ValueError(f"{part}: a weight must be more than 0")
            entries.append(Entry(m["path"].strip(), weight=float(m["amount"])))
        else:
            if int(m["amount"]) < 1:
                raise ValueError(f"{part}: a row count must be at least 1")
            entries.append(Entry(m["path"].strip(), rows=int(m["amount"])))
    return entries


def problems(var: str, value: str) -> list[str]:
    """What is wrong with the value of SFT_DATASET or SFT_EVAL_DATASET before anything is read."""
    try:
        entries = parse(value)
    except ValueError as e:
        return [f"{var}={value!r}: {e}"]
    found = []
    for e in entries:
        # as every settings problem reads: VAR='value': what is wrong (naming the entry when there are several)
        head = f"{var}={value!r}: " + (f"{e.path}: " if len(entries) > 1 else "")
        path = Path(os.path.expanduser(e.path))
        if not e.local:  # a relative path with an amount that does not parse ('data/chat.jsonl:-5') is said as such
            if hub_name_problem(e.path) is not None:
                hint, neither = _amount_hint(e.path), "neither a local path nor a Hub name such as trl-lib/Capybara"
                found.append(head + ("no such file or folder" + hint if hint else not_a_name(e.path, neither)))
        elif not os.path.exists(path):
            found.append(head + "no such file or folder" + _amount_hint(e.path))
        elif e.kind == "file" and not is_data_file(path):
            found.append(head + f"expected a {FORMATS_SAID}, a folder of them, or a folder written by datasets' "
                         "save_to_disk")
        elif e.kind == "folder":
            found += [head + p for p in _folder_problems(path)]
    return found


def _amount_hint(path: str) -> str:
    """Where what follows the last ':' is an amount that does not parse ('-5', 'abc'), after a path that exists."""
    before, colon, after = path.rpartition(":")
    if not colon or not os.path.exists(os.path.expanduser(before)):
        return ""
    return f" (':{after}' is no amount: a row count such as :5000, or a weight such as :0.5)"


def _folder_problems(path: Path) -> list[str]:
    if is_system(path):  # not walked: the whole filesystem, and /proc's entries vanish as they are listed
        return [f"{os.path.realpath(path)} is a system folder, not a dataset's: give the folder of the data files"]
    # os.walk, not rglob: a folder that vanishes while listed is skipped, not raised
    formats = {LOADERS[data_suffix(name)] for root, _, names in os.walk(path) for name in names
               if is_data_file(name) and os.path.isfile(os.path.join(root, name))}
    if not formats:
        return [f"a folder with no {FORMATS_SAID}, and not one written by datasets' save_to_disk"]
    if len(formats) > 1:  # datasets would read the most common format alone, silently dropping the others
        return [f"mixes {' and '.join(sorted(formats))} files; datasets reads one format per folder: keep one, or "
                "list the folders' files as separate sources"]
    return []


def hub_names(value: str) -> list[str]:
    """The Hub datasets among the entries (none when the value does not parse)."""
    try:
        return [e.path for e in parse(value) if not e.local]
    except ValueError:
        return []


def settings_problems(s) -> list[str]:
    """The data settings' problems that need no file read: sources, and the settings that go together."""
    found = problems("SFT_DATASET", s.dataset)
    if s.eval_dataset:
        found += problems("SFT_EVAL_DATASET", s.eval_dataset)
    if s.eval_fraction > 0 and (s.eval_dataset or s.eval_split):
        found.append(f"SFT_EVAL_FRACTION={str(s.eval_fraction)!r}: evaluation rows come from one place: hold out a "
                     "fraction, or name SFT_EVAL_DATASET / SFT_EVAL_SPLIT, not both")
    if s.eval_steps is not None and not (s.eval_dataset or s.eval_split or s.eval_fraction > 0):
        found.append(f"SFT_EVAL_STEPS={str(s.eval_steps)!r}: nothing to evaluate on: set SFT_EVAL_DATASET, "
                     "SFT_EVAL_SPLIT or SFT_EVAL_FRACTION")
    hub = hub_names(s.dataset)
    for var, value in (("SFT_DATASET_CONFIG", s.dataset_config), ("SFT_DATASET_REVISION", s.dataset_revision)):
        if value is not None and len(hub) != 1:
            found.append(f"{var}={value!r}: applies to one Hub dataset, and SFT_DATASET names "
                         f"{len(hub) or 'none'}" + (f" ({', '.join(hub)})" if hub else ""))
    if s.model_revision is not None and looks_local(s.model):
        found.append(f"SFT_MODEL_REVISION={s.model_revision!r}: applies to a Hub model, and SFT_MODEL is a local path")
    if s.chat_template is not None:
        found += _template_problems(s.chat_template)
    return found


def _template_problems(value: str) -> list[str]:
    path = Path(os.path.expanduser(value))
    if not looks_local(value) and not is_template_file(value):  # a template file, wherever it is written
        return [] if hub_name_problem(value) is None else [
            f"SFT_CHAT_TEMPLATE={value!r}: " + not_a_name(value, "neither a local path nor a Hub name")]
    if not os.path.exists(path):
        return [f"SFT_CHAT_TEMPLATE={value!r}: no such file or folder"]
    if os.path.isfile(path) and path.suffix not in TEMPLATE_SUFFIXES:  # TRL reads any other path as a tokenizer's
        return [f"SFT_CHAT_TEMPLATE={value!r}: expected a .jinja (or .j2) template file, or a model folder"]
    if os.path.isdir(path) and not os.path.isfile(path / "tokenizer_config.json"):
        return [f"SFT_CHAT_TEMPLATE={value!r}: a folder without tokenizer_config.json: give a model or tokenizer "
                "folder, or a .jinja file"]
    return []
