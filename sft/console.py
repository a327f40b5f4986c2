"""What the job's controlling process prints: each line stamped with the UTC time, so a log read later (docker
logs, a scheduler's file, a teammate's copy) says when each step happened without any other tool."""

from __future__ import annotations

from datetime import datetime, timezone


def stamp() -> str:
    """Now, in UTC, as every line and every event says it (ISO 8601, seconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def say(text: object) -> None:
    """Print `text`, each of its lines after the time; flushed at once (the log is read while the job runs)."""
    now = stamp()
    print("\n".join(f"{now} {line}" for line in (str(text).splitlines() or [""])), flush=True)
