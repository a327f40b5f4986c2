"""The job's version, as `entrypoint.py --version` prints it: the image's (the VERSION file its build writes
from `make image`'s git description), else this checkout's `git describe`, else "dev"; then the sha256 of
the code nodes compare, and the versions of the libraries that decide the results."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def version() -> str:
    try:
        found = (ROOT / "VERSION").read_text().strip()
    except OSError:
        found = ""
    if found and found != "dev":
        return found
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10, check=False)
        return out.stdout.strip() or "dev"
    except (OSError, subprocess.TimeoutExpired):
        return "dev"


def text() -> str:
    """'sft-zero 4e43bf4 (code 1a2b3c4d5e6f; python 3.11.9, torch 2.13.0, ...)'."""
    from .controller.coordinate import code_version, versions

    libraries = ", ".join(f"{name} {v}" for name, v in versions().items())
    return f"sft-zero {version()} (code {code_version()[:12]}; {libraries})"
