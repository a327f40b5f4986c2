"""The README and the docs stay true: the settings table (docs/settings.md) is the one the code generates, and
the README lists every exit code."""

from pathlib import Path

from sft.settings import markdown_table

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SETTINGS = REPO / "docs" / "settings.md"


def test_readme_settings_table_matches_the_code():
    text = SETTINGS.read_text()
    start = text.index("<!-- settings-table")
    table = text[text.index("\n", start) + 1:text.index("<!-- /settings-table -->")].strip()
    assert table == markdown_table(), \
        "docs/settings.md's table is stale; run: python -c 'from sft.settings import markdown_table as t; print(t())'"


def test_readme_lists_every_exit_code_of_the_job():
    """The codes a scheduler sees (sft/exitcodes.py; a rank's own are read by the controller alone)."""
    from sft.exitcodes import meanings

    text = README.read_text()
    start = text.index("## Exit codes")
    table = text[start:text.index("\n## ", start)]
    listed = {int(line.split("|")[1]) for line in table.splitlines() if line.startswith("| ") and
              line.split("|")[1].strip().isdigit()}
    assert listed == {code for code, name, _ in meanings() if not name.startswith("RANK_")}
