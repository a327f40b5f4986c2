"""The README and the docs stay true: the settings table is the one the code generates, the exit codes are all
listed, the README stays short, and every relative link leads somewhere."""

import re
from pathlib import Path

from sft.settings import markdown_table

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SETTINGS = REPO / "docs" / "settings.md"
README_MAX_BYTES = 20 * 1024  # a README read in five minutes; the rest is in docs/


def test_readme_settings_table_matches_the_code():
    text = SETTINGS.read_text()
    start = text.index("<!-- settings-table")
    table = text[text.index("\n", start) + 1:text.index("<!-- /settings-table -->")].strip()
    assert table == markdown_table(), \
        "docs/settings.md's table is stale: run make docs (scripts/settings_table.py)"


def test_readme_lists_every_exit_code_of_the_job():
    """The codes a scheduler sees (sft/exitcodes.py; a rank's own are read by the controller alone)."""
    from sft.exitcodes import meanings

    text = README.read_text()
    start = text.index("## Exit codes")
    table = text[start:text.index("\n## ", start)]
    listed = {int(line.split("|")[1]) for line in table.splitlines() if line.startswith("| ") and
              line.split("|")[1].strip().isdigit()}
    assert listed == {code for code, name, _ in meanings() if not name.startswith("RANK_")}


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/"


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a Markdown file's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading's anchor numbered."""
    found, seen = set(), {}
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def _relative_links(path: Path):
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", path.read_text()))
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
            yield target


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            destination = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(REPO)}: {target}"
            if not destination.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
                broken.append(f"{where} (no heading makes #{anchor})")
    assert not broken, "\n".join(broken)
    assert sum(1 for _ in _relative_links(README)) > 10  # the links were found at all
