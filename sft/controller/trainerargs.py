"""SFT_TRAINER_ARGS checked against TRL's SFTConfig before any rank starts: each argument's name (one SFTConfig has,
not one the job sets) and its value (one SFTConfig takes: TrainingArguments.__post_init__ refuses an unknown
lr_scheduler_type or optim, and compares a number written as text with a number, in every rank and in `config`)."""

from __future__ import annotations

import enum
import json
import typing

from ..settings import Settings

# What a field of these types takes, as a message says it; a type not here (text, a dict, a union with text) is left
# to SFTConfig
KINDS = {bool: "true or false", int: "a whole number", float: "a number"}


def trainer_args(s: Settings) -> list[str]:
    """SFT_TRAINER_ARGS's arguments as TRL's SFTConfig reads them, none of the job's own (planner/arguments.py; the
    settings checked that it is a JSON object)."""
    import dataclasses
    import difflib

    from ..planner.arguments import OWNED
    from ..settings.checks import shown_trainer_args

    try:
        args = s.extra_trainer_args
    except ValueError:
        return []  # the settings named it already
    if not isinstance(args, dict) or not args:
        return []
    from trl import SFTConfig  # seconds to import: only when there is something to check

    shown, types = shown_trainer_args(s.trainer_args or ""), typing.get_type_hints(SFTConfig)
    known = {f.name for f in dataclasses.fields(SFTConfig)}
    problems = []
    for name, value in args.items():
        if name in OWNED:
            problems.append(f"SFT_TRAINER_ARGS={shown!r}: {name} is set by the job: use {OWNED[name]}")
        elif name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "not an SFTConfig argument"
            problems.append(f"SFT_TRAINER_ARGS={shown!r}: {name}: unknown argument ({hint})")
        elif (why := value_problem(value, types[name])) is not None:
            problems.append(f"SFT_TRAINER_ARGS={shown!r}: {name}: {why}")
    return problems


def value_problem(value: object, kind: object) -> str | None:
    """Why SFTConfig would refuse `value` for a field of type `kind`, or None: text that is not one of an enum's
    values, or a value of another type where the field takes only numbers or a switch (null is left to SFTConfig)."""
    options = [t for t in typing.get_args(kind) or (kind,) if t is not type(None)]
    enums = [t for t in options if isinstance(t, type) and issubclass(t, enum.Enum)]
    if enums and isinstance(value, str):
        allowed = [str(member.value) for member in enums[0]]
        return None if value in allowed else f"{value!r} is not one of TRL's: {', '.join(allowed)}"
    if value is None or not options or any(t not in KINDS for t in options):
        return None
    if isinstance(value, bool):
        fits = bool in options
    elif isinstance(value, int):
        fits = int in options or float in options
    else:
        fits = isinstance(value, float) and float in options
    if fits:
        return None
    expected = " or ".join(KINDS[t] for t in options)
    if isinstance(value, str):
        return f"{json.dumps(value)} is text, not {expected} (JSON writes those without quotes)"
    return f"{json.dumps(value)} is not {expected}"
