"""Settings from a file as well as the environment.

A YAML job file (SFT_CONFIG, or `entrypoint.py --config FILE`), for those who bring one from TRL (`trl sft
--config`) or Axolotl: a mapping whose keys are the settings' names (`learning_rate`, or `SFT_LEARNING_RATE` as in
the environment), or TRL's and Axolotl's names where one sets a setting (`model_name_or_path`, `num_train_epochs`,
...: ALIASES). The environment wins over the file. Its values become the strings a variable would hold, and are then
parsed and checked as the environment's are: a problem starts with SFT_CONFIG, as every problem starts with its
variable, then names the line and the key (SFT_CONFIG='job.yaml': line 3, num_train_epochs: SFT_EPOCHS='x': ...).

And the other way: a job's settings as an env file (`entrypoint.py config --env`) that `docker run --env-file`
reads back to the same settings. It holds SFT_ settings only: no secret is one, so none is ever printed.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import re
from typing import Any, Mapping

from .fields import PREFIX, Settings

# TRL's (SFTConfig, its ScriptArguments and ModelConfig) and Axolotl's names for a setting's value, where they mean
# the same; a name the settings share (learning_rate, max_length, max_steps, save_steps, seed, output_dir, packing,
# report_to, run_name, ...) needs none
ALIASES = {
    "model_name_or_path": "model", "base_model": "model",
    "dataset_name": "dataset", "dataset_train_split": "dataset_split", "dataset_test_split": "eval_split",
    "num_train_epochs": "epochs", "num_epochs": "epochs",
    "per_device_train_batch_size": "micro_batch", "micro_batch_size": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "sequence_len": "max_length",
    "deepspeed": "ds_config",
    "hub_model_id": "hub_repo",
    "chat_template_path": "chat_template",
}
# Other tools' names for a setting, for an unknown key's or variable's hint alone (not read as the setting: a
# batch_size may be the global one); spelling alone finds nothing near 'lr'
HINTS = {"lr": "learning_rate", "batch_size": "micro_batch", "max_seq_length": "max_length", "seq_len": "max_length"}
# A switch of TRL's that is one value of a setting here: bf16 true or false is SFT_PRECISION bf16 or fp32
SWITCHES = {"bf16": ("precision", {True: "bf16", False: "fp32"})}
# Keys that would hold a secret (TRL's hub_token, a pasted HF_TOKEN or WANDB_API_KEY): refused without their value.
# Not every *_token: TRL's eos_token and pad_token are tokens of the vocabulary
SECRET = re.compile(r"^(hub_|hf_)?token$|api_?key|password|secret|tracking_token", re.IGNORECASE)


@dataclasses.dataclass
class JobFile:
    """What a job file says, as variables: each value as the environment would hold it, where it was written
    (`SFT_CONFIG='job.yaml': line 3, num_train_epochs`), and what is wrong with the file itself."""

    values: dict[str, str] = dataclasses.field(default_factory=dict)
    origins: dict[str, str] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)


def read(path: str) -> JobFile:
    """The job file at `path`, or its problems (unreadable, not YAML, not a mapping, unknown keys, ...)."""
    import yaml

    shown = f"SFT_CONFIG={path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL in the path
        why = getattr(e, "strerror", None) or str(e)
        return JobFile(problems=[f"{shown}: cannot read it ({why}): expected a YAML job file"])
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes, for each key's line
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return JobFile(problems=[f"{shown}: not YAML{where}: {getattr(e, 'problem', None) or e}"])
    if data is None:
        return JobFile()  # an empty file says nothing
    if not isinstance(data, dict):
        return JobFile(problems=[f"{shown}: expected a mapping of settings (learning_rate: 2e-5, one a line), "
                                 f"found a {type(data).__name__}"])
    return _entries(path, root, data)


def _entries(path: str, root: Any, data: dict) -> JobFile:
    found = JobFile()
    names = {f.name for f in dataclasses.fields(Settings)}
    lines = {str(k.value): k.start_mark.line + 1 for k, _ in root.value}
    seen: dict[str, str] = {}  # the setting each key set: two keys for one setting are a problem
    for key, value in data.items():
        key = str(key)
        where = f"SFT_CONFIG={path!r}: line {lines.get(key, '?')}, {key}"
        name, problem = _setting_of(key, value, names)
        if problem is None and name in seen:
            problem = f"sets {PREFIX}{name.upper()} as {seen[name]} does: keep one"
        if problem is not None:
            found.problems.append(f"{where}: {problem}")
            continue
        seen[name] = key
        if value is None:
            continue  # `key:` with no value leaves the setting at its default, as an empty variable does
        found.values[PREFIX + name.upper()] = _as_text(SWITCHES[key][1].get(value, value) if key in SWITCHES
                                                       else value)
        found.origins[PREFIX + name.upper()] = where
    found.problems += [f"SFT_CONFIG={path!r}: line {n}: {k} is written twice" for k, n in _twice(root)]
    return found


def _setting_of(key: str, value: Any, names: set[str]) -> tuple[str, str | None]:
    """The setting a key sets, or why it sets none (a secret's value is never shown)."""
    name = key[len(PREFIX):].lower() if key.upper().startswith(PREFIX) else ALIASES.get(key, key)
    if key in SWITCHES:
        name, values = SWITCHES[key]
        if value is not None and value not in values:
            return name, f"{value!r}: expected true or false"
    if name == "config":
        return name, "a job file cannot name another: give one file"
    if name in names:
        return name, None
    if SECRET.search(key):
        return name, "a secret is read from the environment only (-e HF_TOKEN, -e WANDB_API_KEY), never from a file"
    close = [HINTS[key]] if key in HINTS else difflib.get_close_matches(key, [*sorted(names - {"config"}), *ALIASES,
                                                                            *SWITCHES], n=1)
    hint = f"did you mean {close[0]}?" if close else "`entrypoint.py --help` lists the settings"
    return name, f"unknown key ({hint}; an SFTConfig argument with no setting goes under trainer_args:)"


def _as_text(value: Any) -> str:
    """A YAML value as a variable would hold it: true/false, numbers as written, lists comma-separated (report_to,
    several datasets), a mapping as JSON (trainer_args)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(_as_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    if isinstance(value, datetime.datetime):  # YAML reads an unquoted time as one: SFT_TIME_LIMIT's form again
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def _twice(root: Any) -> list[tuple[str, int]]:
    """Keys written twice (PyYAML keeps the last one silently)."""
    seen, twice = set(), []
    for k, _ in root.value:
        if k.value in seen:
            twice.append((k.value, k.start_mark.line + 1))
        seen.add(k.value)
    return twice


def merged(environ: Mapping[str, str]) -> tuple[dict[str, str], JobFile]:
    """The variables to read: the job file's (SFT_CONFIG, when set), the environment's over them."""
    path = (environ.get(PREFIX + "CONFIG") or "").strip()
    job = read(path) if path else JobFile()
    given = {**job.values, **{k: v for k, v in environ.items() if k.startswith(PREFIX) and v.strip()}}
    job.origins = {k: v for k, v in job.origins.items() if not environ.get(k, "").strip()}  # the environment's won
    return given, job


def located(problems: list[str], job: JobFile) -> list[str]:
    """Each problem with a value from the job file says where in the file it was written."""
    out = []
    for p in problems:
        var = p.split("=", 1)[0]
        out.append(f"{job.origins[var]}: {p}" if var in job.origins else p)
    return out


def env_file(s: Settings, source: str) -> str:
    """The settings as an env file (VAR=value lines, as `docker run --env-file` reads them) that reproduces them:
    each setting that differs from its default. `source`: where they were read, for the first line."""
    lines = [f"# {source}", "# docker run --env-file THIS_FILE ...; secrets (HF_TOKEN, WANDB_API_KEY, ...) are not "
             "here: pass them with -e NAME", "# every other setting is at its default (entrypoint.py --help)"]
    for f in dataclasses.fields(Settings):
        value = getattr(s, f.name)
        if f.name == "config" or value == f.default or value is None:
            continue  # the file's values are written out here, each one
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if "\n" in text and f.name == "trainer_args":
            text = json.dumps(json.loads(text))  # the same arguments on one line
        if "\n" in text:  # an env file holds one line a variable
            lines.append(f"# {PREFIX}{f.name.upper()} holds a line break, which an env file cannot: pass it with -e")
            continue
        lines.append(f"{PREFIX}{f.name.upper()}={text}")
    return "\n".join(lines) + "\n"
