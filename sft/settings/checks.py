"""The checks that involve more than one variable's syntax: files, formats, combinations (parse.py parses each
variable). Called by parse.from_env, so every problem is reported with the others, in the same form. What needs
a read of what the settings name (a model's files, DeepSpeed's config model, the GPUs) is checked above the
settings, with them (controller/inputs.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .. import tracking
from . import entries
from .entries import looks_local
from .fields import Settings
from .names import hub_name_problem, not_a_name
from .paths import output_problems
from .problems import bad
from .times import parse_limit

HF_TOKEN_TEXT = re.compile(r"hf_[A-Za-z0-9]{6,}")  # how Hugging Face tokens look
BRANCH = re.compile(r"^(?!.*\.\.)(?!.*//)[A-Za-z0-9][\w./-]*(?<![./])$")  # a git branch name, as the Hub takes one


def check(s: Settings) -> list[str]:
    """Checks that involve more than one variable's syntax: files, formats, combinations."""
    problems = []
    if s.max_steps == 0:
        problems.append(bad("SFT_MAX_STEPS", 0, "expected -1 (full epochs) or a positive number of steps"))
    problems += _check_source("SFT_MODEL", s.model, expect_dir=True)
    problems += entries.settings_problems(s)
    if s.ds_config is not None:
        problems += _check_ds_config(s)
    if s.gpus != "all" and not re.fullmatch(r"\d+(,\d+)*", s.gpus):
        problems.append(bad("SFT_GPUS", s.gpus, "expected all, or GPU indices such as 0,1,2,3"))
    elif s.gpus != "all" and len(set(s.gpus.split(","))) != len(s.gpus.split(",")):
        problems.append(bad("SFT_GPUS", s.gpus, "a GPU is listed twice"))
    if s.hub_repo is not None and ((why := hub_name_problem(s.hub_repo)) or "/" not in s.hub_repo):
        problems.append(bad("SFT_HUB_REPO", s.hub_repo, "expected a repo id such as your-name/qwen3-8b-sft"
                            + (f" ({why})" if why else " (owner/name: the job never guesses the owner)")))
    if s.trainer_args is not None:
        problems += trainer_args_problems(s.trainer_args)
    if s.liger_kernels == "true" and not liger_available():
        problems.append(bad("SFT_LIGER_KERNELS", "true", "liger-kernel and triton are not both installed here "
                             "(the image has them): install them, or use auto or false"))
    if s.attention == "flash_attention_4" and not flash_attention_4_installed():
        problems.append(bad("SFT_ATTENTION", s.attention, "flash-attn-4 is not installed here (the image has it; "
                             "`pip install flash-attn-4` on a host with a CUDA build of torch): install it, or use "
                             "auto"))
    if s.liger_kernels == "true" and s.compile == "true":
        problems.append(bad("SFT_LIGER_KERNELS", "true", "not with SFT_COMPILE=true: compiled with Liger's kernels, "
                             "training's loss was NaN from the third step on an H200 (docs/speed.md); set one of "
                             "them to auto"))
    if s.save_minutes is not None and s.save_steps is not None:
        problems.append(bad("SFT_SAVE_MINUTES", s.save_minutes, f"not with SFT_SAVE_STEPS={s.save_steps}: checkpoints "
                            "are saved by time or by steps; unset one of them"))
    problems += output_problems(s)
    problems += service_problems(s)
    problems += optimizer_problems(s)
    return problems + sequence_parallel_problems(s)


def optimizer_problems(s: Settings) -> list[str]:
    """SFT_OPTIMIZER against the other settings that name an optimizer or an option."""
    if s.optimizer == "auto":
        return []
    if s.trainer_args is not None and not trainer_args_problems(s.trainer_args) and "optim" in s.extra_trainer_args:
        return [bad("SFT_OPTIMIZER", s.optimizer, "not with an optim in SFT_TRAINER_ARGS: both name the optimizer; "
                    "unset one of them")]
    eight = s.optimizer == "adamw-8bit"
    if s.ds_config is None and s.zero_stage != "auto" and not eight and s.zero_stage.endswith("-8bit"):
        return [bad("SFT_OPTIMIZER", s.optimizer, f"not with SFT_ZERO_STAGE={s.zero_stage}, whose state is 8-bit; "
                    f"use SFT_ZERO_STAGE={s.zero_stage.removesuffix('-8bit')} or SFT_OPTIMIZER=adamw-8bit")]
    if eight and s.ds_config is None and "offload" in s.zero_stage:
        return [bad("SFT_OPTIMIZER", s.optimizer, f"not with SFT_ZERO_STAGE={s.zero_stage}: offload runs DeepSpeed's "
                    "CPU Adam, in full precision; 8-bit AdamW runs on the GPUs (SFT_ZERO_STAGE 1, 2 or 3)")]
    if s.ds_config is not None and not _check_ds_config(s):
        zero = s.user_ds_config.get("zero_optimization") or {}
        if s.user_ds_config.get("optimizer"):
            return [bad("SFT_OPTIMIZER", s.optimizer, "not with an optimizer in your DeepSpeed file (SFT_DS_CONFIG): "
                        "both name the optimizer; unset one of them")]
        if eight and (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None):
            return [bad("SFT_OPTIMIZER", s.optimizer, "not with your DeepSpeed file's offload_optimizer: offload runs "
                        "DeepSpeed's CPU Adam, in full precision")]
    return []


def trainer_args_problems(value: str) -> list[str]:
    """SFT_TRAINER_ARGS is a JSON object (the arguments it names are checked against TRL's SFTConfig and the job's
    own with the settings' inputs: controller/inputs.py)."""
    try:
        args = json.loads(value)
    except json.JSONDecodeError as e:
        return [f"SFT_TRAINER_ARGS={shown_trainer_args(value)!r}: not JSON ({e})"]
    if not isinstance(args, dict):
        return [f"SFT_TRAINER_ARGS={shown_trainer_args(value)!r}: "
                'expected a JSON object such as {"dataloader_num_workers": 2}']
    return []


def shown_trainer_args(value: str) -> str:
    """SFT_TRAINER_ARGS as a message may show it: a token typed in it never reaches the log."""
    try:
        args = json.loads(value)
    except json.JSONDecodeError:
        args = None
    if isinstance(args, dict) and "hub_token" in args:
        return json.dumps({**args, "hub_token": "***"})
    return HF_TOKEN_TEXT.sub("hf_***", value)


def liger_available() -> bool:  # also the machine's fact (controller/machine.py)
    """liger-kernel and the Triton it compiles with are importable (found, not imported: Triton is slow)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("liger_kernel", "triton"))


def flash_attention_4_installed() -> bool:  # also the machine's fact (controller/machine.py)
    """flash-attn-4's kernels and the CuTe DSL that compiles them are installed (found, not imported)."""
    import importlib.util

    try:
        return all(importlib.util.find_spec(name) is not None for name in ("flash_attn.cute", "cutlass"))
    except ModuleNotFoundError:  # no flash_attn package at all
        return False


def model_problems(var: str, value: str) -> list[str]:
    """Why `value` names no model, as SFT_MODEL's are told (`plan --model` gives one in its place)."""
    return _check_source(var, value, expect_dir=True)


def _check_source(var: str, value: str, expect_dir: bool) -> list[str]:
    path = Path(os.path.expanduser(value))
    if not looks_local(value):
        if hub_name_problem(value) is None:
            return []
        return [bad(var, value, not_a_name(value, "neither a local path nor a Hub name such as Qwen/Qwen3-8B"))]
    if not os.path.exists(path):  # False for a name Linux cannot hold (os.path never raises)
        return [bad(var, value, "no such file or folder")]
    if expect_dir and not os.path.isfile(path / "config.json"):
        return [bad(var, value, "expected a model folder with config.json (as save_pretrained writes)")]
    return []


def _check_ds_config(s: Settings) -> list[str]:
    try:
        config = s.user_ds_config
    except FileNotFoundError:
        return [bad("SFT_DS_CONFIG", s.ds_config, "no such file")]
    except (OSError, json.JSONDecodeError) as e:
        return [bad("SFT_DS_CONFIG", s.ds_config, f"not a readable JSON file ({e})")]
    if not isinstance(config, dict) or "zero_optimization" not in config:
        return [bad("SFT_DS_CONFIG", s.ds_config, "expected a DeepSpeed config with a zero_optimization section")]
    return []


def service_problems(s: Settings) -> list[str]:
    """Trackers, the budget and the time limit, the Hub branch: each named in one line."""
    problems = [bad("SFT_REPORT_TO", s.report_to, why) for why in tracking.problems(s.report_to)]
    if s.max_cost is not None and s.price_per_hour is None:
        problems.append(bad("SFT_MAX_COST", s.max_cost, "needs SFT_PRICE_PER_HOUR, the machine's price per hour"))
    if (s.max_hours is not None or s.max_cost is not None) and s.probe_steps == 0:
        problems.append(bad("SFT_PROBE_STEPS", 0, "SFT_MAX_HOURS and SFT_MAX_COST are checked against the probe's "
                             "projection: keep the probe (SFT_PROBE_STEPS above 0), or unset the cap"))
    if s.time_limit is not None:
        try:
            parse_limit(s.time_limit, 0.0)
        except ValueError as e:
            problems.append(bad("SFT_TIME_LIMIT", s.time_limit, str(e)))
    if s.hub_revision is not None and s.hub_repo is None:
        problems.append(bad("SFT_HUB_REVISION", s.hub_revision, "needs SFT_HUB_REPO, the repo it is a branch of"))
    elif s.hub_revision is not None and not BRANCH.match(s.hub_revision):
        problems.append(bad("SFT_HUB_REVISION", s.hub_revision, "expected a branch name such as run-2 or exp/lr-1e-5"))
    return problems


def sequence_parallel_problems(s: Settings) -> list[str]:
    """What a row split over N GPUs asks of the other settings, one line each (check reports them with the others;
    the machine and the model are checked by the planner's rule, rules.sequence_parallel)."""
    n = s.sequence_parallel
    if n in ("auto", 1):
        return []
    needs = ["SFT_PACKING=false: Ulysses attention over sdpa drops the mask that keeps packed conversations apart, "
             "so they would attend to each other" if s.packing else "",
             f"SFT_ATTENTION=auto or sdpa: DeepSpeed's Ulysses wraps sdpa, not {s.attention}"
             if s.attention not in ("auto", "sdpa") else "",
             f"an SFT_MAX_LENGTH that {n} divides: each GPU holds an equal share of a row" if s.max_length % n else ""]
    return [f"SFT_SEQUENCE_PARALLEL='{n}': needs {need}" for need in needs if need]
