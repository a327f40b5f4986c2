"""How a problem with the settings reads, and how the list of them is shown before exit 2."""

from __future__ import annotations

from typing import Any


class SettingsError(Exception):
    """All problems found in the environment, one line each; `settings` holds the values that did parse
    (defaults where one did not), so the inputs they name can still be checked and reported with them."""

    def __init__(self, problems: list[str], settings: Any = None):
        self.problems, self.settings = problems, settings
        super().__init__("\n".join(problems))


def bad(var: str, value: Any, message: str) -> str:
    """One problem, as every message reads: the variable, its value as given, what would be valid."""
    return f"{var}={str(value)!r}: {message}"


def refusal(what: str, problems: list[str]) -> str:
    """How a list of problems is shown before exit 2 (settings, data): every one, one line each."""
    return "\n".join([f"error: the {what} not valid; nothing was started:", *(f"  - {p}" for p in problems)])
