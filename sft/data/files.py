"""Why a local file cannot be read, said so a user can fix it: an empty file, or the line that is not JSON.

Written by hand because datasets does not say it: an empty JSON Lines file raises a bare StopIteration,
and a bad line "An error occurred while generating the dataset", its row number only in a log line and
never the file's name. This runs only after datasets failed, so a good file is parsed once, by datasets.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
from pathlib import Path
from typing import BinaryIO

from ..settings.entries import TEXT_SUFFIXES, data_suffix

SHOWN = 3  # bad lines named per file; the rest are counted
CHUNK = 1 << 20  # bytes read at a time: a file of any size is checked in constant memory
# Byte-order marks of what datasets cannot read (UTF-8's own mark it reads), longest first: UTF-32's starts as UTF-16's
MARKS = ((codecs.BOM_UTF32_LE, "UTF-32 LE", "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32 BE", "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16 LE", "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16 BE", "UTF-16"))


def before_reading(paths: list[Path]) -> list[str]:
    """What must be said before datasets reads these files, one line each: a text file that is not UTF-8 (pyarrow
    reads JSON Lines without checking it: its UnicodeDecodeError came only when a row was read, as a traceback
    naming no file), and a JSON file whose first row is null (pyarrow's JSON reader (26.0) crashes the process on it:
    a segmentation fault, exit 139)."""
    found = []
    for path in (p for p in paths if data_suffix(p) in TEXT_SUFFIXES):
        why = encoding_problem(path)
        if why is None and data_suffix(path) in (".json", ".jsonl"):
            why = _null_first(path)
        if why is not None:
            found.append(why)
    return found


def open_rows(path: Path) -> BinaryIO:
    """The file's bytes as datasets reads them: decompressed where its name ends in .gz, .bz2 or .xz."""
    return COMPRESSED[path.suffix][0](path, "rb") if path.suffix in COMPRESSED else open(path, "rb")  # noqa: SIM115


COMPRESSED = {".gz": (gzip.open, "gzip"), ".bz2": (bz2.open, "bzip2"), ".xz": (lzma.open, "xz")}  # opener, tool
UNREADABLE = (OSError, EOFError, lzma.LZMAError)  # a missing file; a corrupt or truncated compressed one


def _null_first(path: Path) -> str | None:
    with open_rows(path) as f:
        for number, line in enumerate(f, start=1):
            text = line.strip().lstrip(codecs.BOM_UTF8).strip()
            if text:
                return (f"{path}, line {number}: a JSON null, not an object of columns: remove the line"
                        if text == b"null" else None)
    return None


def encoding_problem(path: Path) -> str | None:
    try:
        with open_rows(path) as f:
            head = f.read(4)
            for mark, name, codec in MARKS:
                if head.startswith(mark):
                    return _not_utf8(path, f"is {name} (its byte-order mark says so)", codec)
            if len(head) >= 2 and b"\x00" in head:  # UTF-16 or -32 without a mark: ASCII with zero bytes between
                return _not_utf8(path, "is UTF-16 or UTF-32 without a byte-order mark (zero bytes between its "
                                 "letters)", "UTF-16")
            f.seek(0)
            return _first_bad_line(path, f)
    except UNREADABLE as e:
        return f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})"


def _first_bad_line(path: Path, f) -> str | None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines, tail = 1, b""  # the number of the line this chunk starts in, and that line's bytes before the chunk
    while chunk := f.read(CHUNK):
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as e:
            at = max(e.start - (len(e.object) - len(chunk)), 0)  # in this chunk (the decoder held a few bytes back)
            before = chunk[:at]
            line = lines + before.count(b"\n")
            column = len(tail + before if b"\n" not in before else before.rsplit(b"\n", 1)[1]) + 1
            sample = chunk[at - column + 1 if column <= at else 0:][:CHUNK]
            return _not_utf8(path, f"is not UTF-8 from line {line}, byte {column} (0x{chunk[at:at + 1].hex().upper()})"
                             f"; it reads as {_guess(sample)}", "CP1252" if _is_cp1252(sample) else "LATIN1")
        lines += chunk.count(b"\n")
        tail = (tail + chunk) if b"\n" not in chunk else chunk.rsplit(b"\n", 1)[1]
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return _not_utf8(path, f"ends inside a UTF-8 character (line {lines}): the file was cut short", "UTF-8")
    return None


def _is_cp1252(data: bytes) -> bool:
    try:
        data.decode("cp1252")
    except UnicodeDecodeError:
        return False
    return True


def _guess(data: bytes) -> str:
    """The encoding found, from the bytes after the first bad one: Windows-1252 where each is one of its letters
    (desktop tools' 'ANSI' export), else Latin-1, which any byte is."""
    if _is_cp1252(data):
        return "Windows-1252 (cp1252, what desktop tools export as 'ANSI' or Latin-1)"
    return "Latin-1 (ISO-8859-1) or another one-byte encoding"


def _not_utf8(path: Path, what: str, codec: str) -> str:
    if path.suffix in COMPRESSED:  # the same, through the file's own compression
        tool = COMPRESSED[path.suffix][1]
        return (f"{path}: decompressed, {what}; datasets reads UTF-8 only: save it as UTF-8 (e.g. {tool} -dc "
                f"{path.name} | iconv -f {codec} -t UTF-8 | {tool} > utf8-{path.name})")
    return (f"{path}: {what}; datasets reads UTF-8 only: save it as UTF-8 (e.g. iconv -f {codec} -t UTF-8 "
            f"{path.name} > utf8-{path.name})")


def diagnose(paths: list[Path]) -> list[str]:
    """One line per problem found in these files (empty when they look readable)."""
    found: list[str] = []
    for path in paths:
        try:
            text = _text(path) if data_suffix(path) in (".json", ".jsonl") else None
        except UNREADABLE as e:
            found.append(f"{path}: cannot be read ({e})")
            continue
        if path.stat().st_size == 0 or (text is not None and not text.strip()):
            found.append(f"{path}: empty file")
        elif text is not None:
            found += _json_problems(path, text)
        elif _rows_in(path) == 0:
            found.append(f"{path}: no rows" + (" (a header line only)" if data_suffix(path) == ".csv" else ""))
    return found


def _text(path: Path) -> str:
    # utf-8-sig: a UTF-8 byte-order mark, which datasets reads past, is no JSON problem of the file's
    with open_rows(path) as f:
        return f.read().decode("utf-8-sig", errors="replace")


def _rows_in(path: Path) -> int | None:
    """The rows of a Parquet or CSV file (None: unknown, or the file cannot be read so: datasets' error says)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        if data_suffix(path) == ".csv":
            with open_rows(path) as f:
                return max(sum(1 for line in f if line.strip()) - 1, 0)  # the header
    except Exception:  # noqa: BLE001 - not a Parquet file at all: datasets' own message names it
        return None
    return None


def _json_problems(path: Path, text: str) -> list[str]:
    if data_suffix(path) == ".json":
        try:
            return _document_problems(path, json.loads(text))
        except json.JSONDecodeError as e:
            if not _first_line_is_an_object(text):  # one JSON document (an array of rows): where it breaks
                return [f"{path}, line {e.lineno} column {e.colno}: not JSON ({e.msg})"]
    bad, columns = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            bad.append(f"{path}, line {number}: not JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(row, dict):
            bad.append(f"{path}, line {number}: a JSON {type(row).__name__}, not an object of columns")
        columns = columns or bool(row)
    if not bad and not columns:
        return [f"{path}: no row has a column (every line is {{}})"]
    if len(bad) > SHOWN:
        bad = bad[:SHOWN] + [f"{path}: {len(bad) - SHOWN} more lines like these"]
    return bad


def _document_problems(path: Path, document) -> list[str]:
    """One JSON document: an array of objects, one a row (datasets' error for anything else names neither)."""
    if isinstance(document, dict):
        return []  # one row, or datasets' other layouts: what it says of them stands
    if not isinstance(document, list):
        return [f"{path}: a JSON {type(document).__name__}, not an array of rows (objects of columns)"]
    if not document:
        return [f"{path}: no rows (an empty JSON array)"]
    bad = [i for i, item in enumerate(document) if not isinstance(item, dict)]
    if bad:
        shown = ", ".join(str(i + 1) for i in bad[:SHOWN]) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
        return [f"{path}: item{'s' if len(bad) > 1 else ''} {shown} of its array {'are' if len(bad) > 1 else 'is'} "
                f"not an object of columns (a JSON {type(document[bad[0]]).__name__})"]
    return []


def _first_line_is_an_object(text: str) -> bool:
    """JSON Lines in a .json file (datasets reads both): its first line is a whole object."""
    first = text.lstrip().split("\n", 1)[0]
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False
