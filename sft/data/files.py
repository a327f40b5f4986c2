"""Why a local file cannot be read, said so a user can fix it: an empty file, or the line that is not JSON.

Written by hand because datasets does not say it: an empty JSON Lines file raises a bare StopIteration,
and a bad line "An error occurred while generating the dataset", its row number only in a log line and
never the file's name. This runs only after datasets failed, so a good file is parsed once, by datasets.
"""

from __future__ import annotations

import json
from pathlib import Path

SHOWN = 3  # bad lines named per file; the rest are counted


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
