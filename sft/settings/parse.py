"""The settings read from the environment: every SFT_* variable parsed and checked by one function, `from_env`,
which reports every problem at once (a batch job should fail once, with the whole list, not once per typo)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from typing import Any, Mapping

from .. import nodes
from . import files
from .checks import check
from .fields import CHECKPOINTING, FLOAT_MAX, INT_MAX, LAUNCHERS, PREFIX, SWITCH, TRUE, FALSE, Settings
from .problems import SettingsError, bad


def env_name(name: str) -> str:
    return PREFIX + name.upper()


def describe() -> list[tuple[str, str, str]]:
    """(variable, default, help) for every setting: for --help and docs/settings.md."""
    rows = []
    for f in dataclasses.fields(Settings):
        default = "unset" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) else str(
            f.default)
        rows.append((env_name(f.name), default, f.metadata["help"]))
    return rows


def markdown_table() -> str:
    """docs/settings.md's table of variables (a test keeps the file equal to this)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | `{default}` | {help} |" for var, default, help in describe()]
    return "\n".join(lines)


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read, parse and check every SFT_* variable; raise SettingsError listing every problem."""
    environ = os.environ if environ is None else environ
    fields = {env_name(f.name): f for f in dataclasses.fields(Settings)}
    given, job = files.merged(environ)  # SFT_CONFIG's job file, the environment over it
    problems = job.problems + _unknown_variables(environ, fields)
    values = {}
    for var, f in fields.items():
        raw = given.get(var)
        if raw is None or raw.strip() == "":
            continue
        if "\x00" in raw:  # no path, name or number holds one (the environment itself cannot carry it)
            problems.append(bad(var, raw, "contains a NUL character"))
            continue
        try:
            values[f.name] = _parse(f, raw.strip())
        except ValueError as e:
            problems.append(bad(var, raw, str(e)))
    problems += nodes.problems(environ, values.get("launcher", LAUNCHERS[0]))
    if values.get("batch_search", "auto") == "auto" and any(given.get(v, "").strip() for v in (
            env_name("micro_batch"), env_name("grad_accum"))):
        values["batch_search"] = "false"  # a split the user wrote is kept as written
    # A value that did not parse keeps its default here, so one typo does not hide the other problems.
    settings = Settings(**values)
    problems = files.located(problems + check(settings), job)
    if problems:
        raise SettingsError(problems, settings)
    return settings


def _unknown_variables(environ: Mapping[str, str], fields: dict) -> list[str]:
    # a setting's name in lower or mixed case (-e sft_learning_rate=...) was ignored, and its default trained
    problems = [f"{var}: unknown setting (a variable's name is upper case: {var.upper()})" for var in sorted(environ)
                if var not in fields and var.upper() in fields]
    for var in sorted(v for v in environ if v.startswith(PREFIX) and v not in fields):
        rest = var[len(PREFIX):].lower()  # under TRL's name or another tool's, spelling alone points elsewhere:
        # SFT_LR to SFT_MODEL, SFT_GRADIENT_ACCUMULATION_STEPS to SFT_GRADIENT_CHECKPOINTING
        # 0.7: the shared SFT_ lifts every pair; at difflib's 0.6 SFT_WARMUP_RATIO meant SFT_EVAL_FRACTION
        close = [env_name(n)] if (n := files.ALIASES.get(rest) or files.HINTS.get(rest)) else difflib.get_close_matches(
            var, fields, n=1, cutoff=0.7)
        hint = f"did you mean {close[0]}?" if close else ("see `entrypoint.py --help` for the list; TRL's other "
                                                          "arguments go in SFT_TRAINER_ARGS")
        problems.append(f"{var}: unknown setting ({hint})")
    return problems


def _parse(f: dataclasses.Field, raw: str) -> Any:
    kind = str(f.type)
    choices = f.metadata.get("choices")
    if "bool" in kind or choices in (SWITCH, CHECKPOINTING):
        if choices and raw.lower() in choices:
            return raw.lower()
        try:
            return _parse_switch(raw, allow_auto="bool" not in kind)
        except ValueError:
            if choices == CHECKPOINTING:
                raise ValueError("expected auto, true, false or offload") from None
            raise
    if "int" in kind:
        if f.metadata.get("auto") and raw.lower() == "auto":
            return "auto"
        try:
            value: Any = int(raw)
        except ValueError:
            raise ValueError("expected auto or a whole number" if f.metadata.get("auto") else
                             "expected a whole number") from None
    elif "float" in kind:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("expected a number") from None
        if not math.isfinite(value):  # float() reads inf, nan and 1e999: none is a setting's value
            raise ValueError("expected a finite number")
    else:
        value = raw
    _check_bounds(f.metadata, value)
    return value


def _parse_switch(raw: str, allow_auto: bool) -> bool | str:
    """true/false in the usual spellings; where auto is allowed, the words "auto", "true", "false"."""
    word = raw.lower()
    if word in TRUE or word in FALSE:
        return str(word in TRUE).lower() if allow_auto else word in TRUE
    if allow_auto and word == "auto":
        return word
    raise ValueError("expected true or false (1/0, yes/no, on/off)" + (", or auto" if allow_auto else ""))


def _check_bounds(meta: Mapping[str, Any], value: Any) -> None:
    if "choices" in meta and value not in meta["choices"]:
        raise ValueError("expected one of " + ", ".join(meta["choices"]))
    if "min" in meta and value < meta["min"]:
        raise ValueError(f"expected at least {meta['min']}")
    if "gt" in meta and not value > meta["gt"]:
        raise ValueError(f"expected more than {meta['gt']}")
    if "lt" in meta and not value < meta["lt"]:
        raise ValueError(f"expected less than {meta['lt']}")
    # Every number has a ceiling: one past what the libraries take overflows inside them (float(), int32), after
    # the start, as a traceback
    ceiling = meta.get("max", FLOAT_MAX if isinstance(value, float) else INT_MAX)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > ceiling:
        raise ValueError(f"expected at most {ceiling:g}" if isinstance(ceiling, float) else
                         f"expected at most {ceiling}")
