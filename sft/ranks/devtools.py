"""The one seam through which a developer's tools reach a rank: sft/dev/ (the tests' faults, a profiler of one step),
imported by name only when an SFTDEV_ or SFTTEST_ variable is set, which no user sets: a user's job never loads it.
Written by hand: the Trainer's callbacks are the hook, but something must choose whether to make them."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PACKAGE = "sft.dev"
PREFIXES = ("SFTDEV_", "SFTTEST_")


def load() -> ModuleType | None:
    """sft/dev/ where a developer's variable asks for it, else None."""
    if any(name.startswith(PREFIXES) for name in os.environ):
        return importlib.import_module(PACKAGE)
    return None
