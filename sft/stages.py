"""The ZeRO options the job knows: one table, and the DeepSpeed configs it ships for them.

Every other module names an option by its `name` ("2", "3-offload", ...), the spelling SFT_ZERO_STAGE
takes, and asks this table for the rest. The configs in ds_configs/ are the seed guide's, verbatim;
`shipped_config` adds the job's one change to them (bf16's overflow check, below). A user's own DeepSpeed
file (SFT_DS_CONFIG) is used as written.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent.parent / "ds_configs"


@dataclass(frozen=True)
class Stage:
    """One ZeRO option: DeepSpeed's stage number, what it offloads to the host, and its shipped config."""

    name: str
    zero: int
    offload_optimizer: bool
    offload_params: bool
    config_file: str

    @property
    def offload(self) -> bool:
        return self.offload_optimizer

    @property
    def label(self) -> str:
        """'3-offload' -> 'ZeRO-3-offload', as people write it."""
        return "ZeRO-" + self.name


# In the order of less GPU memory each time: what the probe escalates through when one does not fit.
TABLE = (
    Stage("1", 1, False, False, "zero1.json"),
    Stage("2", 2, False, False, "zero2.json"),
    Stage("3", 3, False, False, "zero3.json"),
    Stage("3-offload", 3, True, False, "zero3_offload.json"),
    Stage("3-offload-all", 3, True, True, "zero3_offload_all.json"),
)
NAMES = tuple(s.name for s in TABLE)
# What auto picks from: the first that fits. ZeRO-1 and 2 move what plain data parallelism moves per
# step (ZeRO paper), so ZeRO-2, which holds less, goes first; ZeRO-1 can still be asked for by name.
# Offload only when nothing else fits (the seed's rule).
PREFERENCE = ("2", "1", "3", "3-offload", "3-offload-all")


def get(name: str) -> Stage:
    return next(s for s in TABLE if s.name == name)


def next_after(name: str) -> str | None:
    """The option that holds less on each GPU than `name`, or None after the last."""
    i = NAMES.index(name)
    return NAMES[i + 1] if i + 1 < len(NAMES) else None


@functools.cache
def _read_shipped(name: str) -> str:
    return (CONFIG_DIR / get(name).config_file).read_text()


def shipped_config(name: str) -> dict[str, Any]:
    """The shipped DeepSpeed config of an option (a fresh copy: callers may change it), with bf16's overflow
    check off. DeepSpeed 0.19 checks every gradient for inf/NaN before a bf16 step, as for fp16, whose loss
    scaling needs it: four kernels and a host loop per parameter. Without it Qwen3-4B's defaults ran faster, with
    the same losses (measured: docs/speed.md, 'bf16's overflow check off').
    bf16 has fp32's range and no loss scale. Without the check DeepSpeed applies a step whose gradient holds a
    NaN (its norm, computed anyway, reads inf): the ranks stop at that norm, before the step is saved
    (ranks/progress.py).

    And with DeepSpeed's throughput timer off: on by default, it synchronises the GPU at the start and end of
    every forward (HF's Trainer hands DeepSpeed no dataloader), for a samples/s figure the job never prints;
    the ranks time their own steps (ranks/progress.py)."""
    config = json.loads(_read_shipped(name))
    config.setdefault("bf16", {})["check_grad_overflow"] = False
    config.setdefault("timers", {})["throughput"] = {"enabled": False}
    return config


def of_config(config: dict[str, Any]) -> Stage:
    """The option a DeepSpeed config amounts to, named as SFT_ZERO_STAGE names it (a user's file may
    name one the table lacks, such as "2-offload": it gets a Stage of its own, with no shipped file)."""
    zero = config.get("zero_optimization") or {}

    def offloaded(key: str) -> bool:
        return (zero.get(key) or {}).get("device", "none") not in ("none", None)

    number, optimizer, params = int(zero.get("stage", 0)), offloaded("offload_optimizer"), offloaded("offload_param")
    name = f"{number}-offload-all" if params else f"{number}-offload" if optimizer else str(number)
    return get(name) if name in NAMES else Stage(name, number, optimizer or params, params, "")


def without_pinned_memory(config: dict[str, Any]) -> dict[str, Any]:
    """The same config with pin_memory off: pinned host memory counts against `ulimit -l`."""
    config = copy.deepcopy(config)
    for key in ("offload_optimizer", "offload_param"):
        section = (config.get("zero_optimization") or {}).get(key)
        if section:
            section["pin_memory"] = False
    return config


def overlap_comm(config: Mapping[str, Any], stage: Stage, world: int, users: bool) -> tuple[Mapping[str, Any], str]:
    """The shipped ZeRO-1/2 configs overlap the gradients' reduction with the backward (overlap_comm), for which
    DeepSpeed 0.19.8 synchronises the device before each gradient bucket and at the backward's end: the host waits
    for the GPU's queue about 20 times a step (sft/ranks/patches/reads.py says what such a wait costs). One rank reduces
    nothing, so it is off there (in the plan's rows too). A user's file is left as it is."""
    zero = config.get("zero_optimization") or {}
    if users or world > 1 or stage.zero not in (1, 2) or not zero.get("overlap_comm"):
        return config, "as the config says"
    config = {**config, "zero_optimization": {**zero, "overlap_comm": False}}
    return config, "off: one rank has no gradients to reduce while the backward runs"
