"""The JSON round trip every hand-off shares, and files written so that no reader sees half of one."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def write_json(path: Path, data: Any) -> Path:
    """Write atomically (a reader, or a VM that dies mid-write, never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_json(path: Path) -> Any:
    """The JSON in a file; None when it is missing, unreadable (not UTF-8) or half-written."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: json's JSONDecodeError and the codec's UnicodeDecodeError
        return None


class Record:
    """The JSON round trip every hand-off shares: to_dict, from_dict, save, load."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value, kind = data[f.name], hints[f.name]
            nested = _record_type(kind)
            if nested and isinstance(value, dict):
                value = nested.from_dict(value)
            elif nested and isinstance(value, list):  # list[SomeRecord]
                value = [nested.from_dict(v) if isinstance(v, dict) else v for v in value]
            values[f.name] = value
        return cls(**values)

    def save(self, path: Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls: type[T], path: Path) -> T | None:
        """The record in `path`, or None when there is none (missing, torn or not a JSON object)."""
        data = read_json(path)
        return cls.from_dict(data) if isinstance(data, dict) else None  # type: ignore[attr-defined]


def _record_type(kind: Any) -> type | None:
    """The Record class in a field's type: X, X | None, list[X] (None: no Record in it)."""
    for t in typing.get_args(kind) or (kind,):
        if isinstance(t, type) and issubclass(t, Record):
            return t
        if typing.get_origin(t) is list:
            return _record_type(t)
    return None
