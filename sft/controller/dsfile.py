"""A user's DeepSpeed file (SFT_DS_CONFIG), checked by DeepSpeed's own config model before any rank starts.

DeepSpeedConfig is what every rank builds from the file; without a process group it takes world size 1,
so it can run here. It stops at the first error and does not always say where (a section that is not a
JSON object ends in a TypeError), so each top-level key is checked alone first, which names every bad
key at once, then the whole file for what only the keys together can break (bf16 and fp16 both on).
"auto" is left out: the Trainer fills it from its own arguments at start.

Also a config with every "auto" filled as the Trainer fills it, which `entrypoint.py config` prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

AUTO = "auto"
GATHER = "stage3_gather_16bit_weights_on_model_save"  # ZeRO-3 gathers the weights for save_model (the final model)
MICRO_BATCH = "train_micro_batch_size_per_gpu"  # DeepSpeed needs one batch size; the Trainer fills "auto"


def problems(config: Mapping[str, Any], micro_batch: int) -> list[str]:
    """What DeepSpeed would refuse in the file, one line per key ('zero_optimization.stage='two': ...')."""
    base = {MICRO_BATCH: micro_batch}
    found = []
    for key, value in config.items():
        if value == AUTO:
            continue
        why = _refused({**base, key: _without_auto(value)})
        if why is not None:
            found.append(_named(key, value, why))
    if not found:
        why = _refused({**base, **_without_auto(dict(config))})
        if why is not None:
            found.append(f"the file as a whole: {why[1]}")
    return found + _final_model(config)


def _final_model(config: Mapping[str, Any]) -> list[str]:
    """At ZeRO-3 the Trainer writes the final model's 16-bit weights only where DeepSpeed gathers them for it; without
    that, final/ would hold DeepSpeed's shards, which from_pretrained cannot load (and the Hub would get those)."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict) or zero.get("stage") != 3 or zero.get(GATHER) is True:
        return []
    said = f"={zero[GATHER]!r}" if GATHER in zero else " is left out (DeepSpeed's default: false)"
    return [f"zero_optimization.{GATHER}{said}: at ZeRO-3 the final model would then be DeepSpeed's shards, which "
            "from_pretrained cannot load; set it to true"]


def _without_auto(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_auto(v) for k, v in value.items() if v != AUTO}
    return value


def _refused(config: dict[str, Any]) -> tuple[tuple[str, ...], str] | None:
    """None when DeepSpeed accepts the config; else (where inside the key, DeepSpeed's message)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    try:
        with _quiet():
            DeepSpeedConfig(config)
    except ValidationError as e:
        first = e.errors()[0]
        extra = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        return tuple(str(part) for part in first["loc"]), f"{first['msg']}{extra}"
    except TypeError as e:
        if "must be a mapping" in str(e):  # a section given as a number, string or list
            return (), f"expected a JSON object (a section), as DeepSpeed reads it ({e})"
        return (), f"DeepSpeed refuses it ({e})"
    except (AssertionError, ValueError, KeyError, AttributeError) as e:
        return (), f"DeepSpeed refuses it ({type(e).__name__}: {e})"
    return None


def _named(key: str, value: Any, why: tuple[tuple[str, ...], str]) -> str:
    inner, message = why
    if not inner:
        return f"{key}={value!r}: {message}"
    shown: Any = value
    for part in inner:
        shown = shown.get(part, "?") if isinstance(shown, dict) else "?"
    return f"{'.'.join((key, *inner))}={shown!r}: {message}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DeepSpeed logs the world size and warnings of each config it reads: not news here."""
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def filled_ds_config(config: dict[str, Any], args: Any, world_size: int, model_config: Any,
                     total_steps: int, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config with every "auto" filled as the Trainer fills it, by transformers' own code.

    `args` is the run's SFTConfig made without a DeepSpeed config (so no process group starts here);
    its world size is this process's, so the run's is given, and `overrides` the arguments the run has that
    this process could not make (bf16 where it sees no GPU).
    """
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class _RunArgs:
        def __init__(self):
            self.world_size = world_size

        def __getattr__(self, name):
            return (overrides or {}).get(name, getattr(args, name))

    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    hf.trainer_config_process(_RunArgs())
    hf.trainer_config_finalize(_RunArgs(), SimpleNamespace(config=model_config), total_steps)
    return hf.config
