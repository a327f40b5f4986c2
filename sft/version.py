"""The job's version, as `entrypoint.py --version` prints it: the image's (the VERSION file its build writes
from `make image`'s git description), else this checkout's `git describe`, else "dev"; then the sha256 of
the code nodes compare, and the versions of the libraries that decide the results."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("torch", "deepspeed", "transformers", "trl", "accelerate")


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
    libraries = ", ".join(f"{name} {v}" for name, v in versions().items())
    return f"sft-zero {version()} (code {code_version()[:12]}; {libraries})"


def code_version() -> str:
    """sha256 over the job's own files: the image's code, whatever tag it was pulled by."""
    files = [ROOT / "entrypoint.py", *(ROOT / "sft").rglob("*.py"),
             *(ROOT / "ds_configs").glob("*.json")]
    digest = hashlib.sha256()
    for path in sorted(p for p in files if p.is_file()):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found
