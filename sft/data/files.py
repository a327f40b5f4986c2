"""Why a local file cannot be read, said so a user can fix it: an empty file, or the line that is not JSON.

Written by hand because datasets does not say it: an empty JSON Lines file raises a bare StopIteration,
and a bad line "An error occurred while generating the dataset", its row number only in a log line and
never the file's name. This runs only after datasets failed, so a good file is parsed once, by datasets.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

SHOWN = 3  # bad lines named per file; the rest are counted
TEXT = (".jsonl", ".json", ".csv")  # read as text by datasets, as UTF-8 (Parquet holds its own types)
CHUNK = 1 << 20  # bytes read at a time: a file of any size is checked in constant memory
# Byte-order marks of what datasets cannot read (UTF-8's own mark it reads), longest first: UTF-32's starts as UTF-16's
MARKS = ((codecs.BOM_UTF32_LE, "UTF-32 LE", "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32 BE", "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16 LE", "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16 BE", "UTF-16"))


def encoding_problems(paths: list[Path]) -> list[str]:
    """One line per text file that is not UTF-8, naming the file, the first line that is not, and the encoding
    found. pyarrow reads JSON Lines without checking it: its UnicodeDecodeError came only when a row was read, as a
    traceback naming no file."""
    return [why for path in paths if path.suffix in TEXT and (why := encoding_problem(path)) is not None]


def encoding_problem(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            for mark, name, codec in MARKS:
                if head.startswith(mark):
                    return _not_utf8(path, f"is {name} (its byte-order mark says so)", codec)
            if len(head) >= 2 and b"\x00" in head:  # UTF-16 or -32 without a mark: ASCII with zero bytes between
                return _not_utf8(path, "is UTF-16 or UTF-32 without a byte-order mark (zero bytes between its "
                                 "letters)", "UTF-16")
            f.seek(0)
            return _first_bad_line(path, f)
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror or e})"


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
    return (f"{path}: {what}; datasets reads UTF-8 only: save it as UTF-8 (e.g. iconv -f {codec} -t UTF-8 "
            f"{path.name} > utf8-{path.name})")


def diagnose(paths: list[Path]) -> list[str]:
    """One line per problem found in these files (empty when they look readable)."""
    found: list[str] = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace") if path.suffix in (".json", ".jsonl") else None
        if path.stat().st_size == 0 or (text is not None and not text.strip()):
            found.append(f"{path}: empty file")
        elif text is not None:
            found += _json_problems(path, text)
    return found


def _json_problems(path: Path, text: str) -> list[str]:
    if path.suffix == ".json":
        try:
            json.loads(text)
            return []
        except json.JSONDecodeError as e:
            if not _first_line_is_an_object(text):  # one JSON document (an array of rows): where it breaks
                return [f"{path}, line {e.lineno} column {e.colno}: not JSON ({e.msg})"]
    bad = []
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
    if len(bad) > SHOWN:
        bad = bad[:SHOWN] + [f"{path}: {len(bad) - SHOWN} more lines like these"]
    return bad


def _first_line_is_an_object(text: str) -> bool:
    """JSON Lines in a .json file (datasets reads both): its first line is a whole object."""
    first = text.lstrip().split("\n", 1)[0]
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False
