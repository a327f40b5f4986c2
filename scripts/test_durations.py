#!/usr/bin/env python3
"""tests/durations.txt from a junit report of a whole test run: each file's seconds, longest first, which
tests/conftest.py uses to hand the longest files to the test workers first.

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml && python scripts/test_durations.py /tmp/junit.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.txt"


def main(report: str) -> None:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).iter("testcase"):
        module = next(part for part in case.get("classname", "").split(".") if part.startswith("test_"))
        path = f"tests/{module}.py"  # classname: tests.test_job, or tests.test_job.TestClass
        seconds[path] += float(case.get("time") or 0)
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])
    OUT.write_text("# seconds per test file in a whole run (scripts/test_durations.py): the order they start in\n"
                   + "".join(f"{s:8.1f} {name}\n" for name, s in rows))
    print(f"{OUT}: {len(rows)} files, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1])
