"""The README stays true: its settings table is the one the code generates."""

from pathlib import Path

from sft.settings import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_settings_table_matches_the_code():
    text = README.read_text()
    start = text.index("<!-- settings-table")
    table = text[text.index("\n", start) + 1:text.index("<!-- /settings-table -->")].strip()
    assert table == markdown_table(), "run: python -c 'from sft.settings import markdown_table as t; print(t())'"
