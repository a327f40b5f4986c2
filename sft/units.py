"""Units the job prints: GiB for memory (as DeepSpeed and torch count it), GB for disk and uploads."""

from __future__ import annotations

GIB = 2**30  # GiB: bytes / 2**30, as DeepSpeed prints (it labels them GB)
GB = 10**9  # GB for disk, as df -H counts


def gib(n: int | float) -> float:
    """Bytes as GiB, two decimals (the reports' convention)."""
    return round(n / GIB, 2)


def size_text(n: int) -> str:
    """Bytes for people: '114.7 GB', '3.2 MB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
