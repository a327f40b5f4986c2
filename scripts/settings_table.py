#!/usr/bin/env python3
"""Write docs/settings.md's table of settings from the code (sft/settings/fields.py's help texts): `make docs`.
tests/test_readme.py fails while the file differs from what this writes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sft.settings import markdown_table  # noqa: E402

START, END = "<!-- settings-table", "<!-- /settings-table -->"


def main(path: Path = ROOT / "docs" / "settings.md") -> None:
    text = path.read_text()
    begin = text.index("\n", text.index(START)) + 1
    path.write_text(text[:begin] + markdown_table() + "\n" + text[text.index(END):])


if __name__ == "__main__":
    main()
