"""The machine's own folders, which neither the job's output nor its data may be (paths.py, entries.py)."""

from __future__ import annotations

import os
from pathlib import Path

# The system's own folders: nothing of the job goes in them or under them (resolved: /lib may be a link to /usr/lib)
SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr")
# The top folders that hold others' files: a folder under them is fine, the folder itself is not
SHARED = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv", "/tmp", "/var")


def resolved(folders: tuple[str, ...]) -> set[Path]:
    return {Path(f) for f in folders} | {Path(os.path.realpath(f)) for f in folders if os.path.exists(f)}


def is_system(path: Path) -> bool:
    """The path is a shared top folder itself, or a system folder or under one."""
    real = Path(os.path.realpath(path))
    return str(real) in SHARED or any(real == s or s in real.parents for s in resolved(SYSTEM))
