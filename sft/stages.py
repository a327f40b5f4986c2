"""The ZeRO options the job knows: one table, and the DeepSpeed configs it ships for them.

Every other module names an option by its `name` ("2", "3-offload", "2-8bit", ...), the spelling SFT_ZERO_STAGE
takes, and asks this table for the rest. An option is what decides the memory a GPU holds: the stage, what it
offloads, and the precision of the optimizer's state (full: the Trainer's AdamW, two fp32 moments; 8-bit:
bitsandbytes' AdamW, two 8-bit moments in blocks of 256, 6 bytes a parameter less). A checkpoint records its
option, so a resume keeps the optimizer whose state it holds. The configs in ds_configs/ are the seed guide's, verbatim;
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
    optimizer: str = ""  # the Trainer's optim for it; "": the Trainer's default or SFT_TRAINER_ARGS' optim

    @property
    def offload(self) -> bool:
        return self.offload_optimizer

    @property
    def eight_bit(self) -> bool:
        return self.optimizer == EIGHT_BIT_OPTIM

    @property
    def label(self) -> str:
        """'3-offload' -> 'ZeRO-3-offload', '2-8bit' -> 'ZeRO-2 8-bit AdamW', as people write them."""
        return f"ZeRO-{self.zero} 8-bit AdamW" if self.eight_bit else "ZeRO-" + self.name


# bitsandbytes' AdamW with 8-bit blockwise state (Dettmers et al., "8-bit Optimizers via Block-wise Quantization"),
# by the Trainer's name for it. Chosen over torchao's AdamW8bit: its state is plain uint8 and fp32 tensors in the
# optimizer's state_dict (DeepSpeed saves and loads it as any other), where torchao's is a tensor subclass; and
# torchtune's single-GPU Qwen3-8B recipe runs it (PagedAdamW8bit). DeepSpeed keeps its fp32 master weights and hands
# them to it as to any client optimizer (zero_allow_untested_optimizer, which the Trainer sets).
EIGHT_BIT_OPTIM = "adamw_bnb_8bit"


# In the order of less GPU memory each time, full-precision state first: what the probe escalates through when one
# does not fit (8-bit state only where SFT_OPTIMIZER allows it: next_after).
TABLE = (
    Stage("1", 1, False, False, "zero1.json"),
    Stage("2", 2, False, False, "zero2.json"),
    Stage("3", 3, False, False, "zero3.json"),
    Stage("1-8bit", 1, False, False, "zero1.json", EIGHT_BIT_OPTIM),
    Stage("2-8bit", 2, False, False, "zero2.json", EIGHT_BIT_OPTIM),
    Stage("3-8bit", 3, False, False, "zero3.json", EIGHT_BIT_OPTIM),
    Stage("3-offload", 3, True, False, "zero3_offload.json"),
    Stage("3-offload-all", 3, True, True, "zero3_offload_all.json"),
)
NAMES = tuple(s.name for s in TABLE)
# What auto picks from: the first that fits. ZeRO-1 and 2 move what plain data parallelism moves per
# step (ZeRO paper), so ZeRO-2, which holds less, goes first; ZeRO-1 can still be asked for by name.
# 8-bit state only where no full-precision option fits on the GPUs, and before offload: offloaded, a step of
# Qwen3-4B on one H100 ran at 4.7% MFU (docs/benchmarks.md). Offload only when nothing else fits (the seed's rule).
PREFERENCE = ("2", "1", "3", "2-8bit", "1-8bit", "3-8bit", "3-offload", "3-offload-all")
OPTIMIZERS = ("auto", "adamw", "adamw-8bit")  # SFT_OPTIMIZER's values


def get(name: str) -> Stage:
    return next(s for s in TABLE if s.name == name)


def allowed(name: str, optimizer: str) -> bool:
    """Whether SFT_OPTIMIZER's value lets the job run option `name`: auto any, adamw full-precision state only,
    adamw-8bit 8-bit state only."""
    if optimizer == "auto":
        return True
    return get(name).eight_bit == (optimizer == "adamw-8bit")


def named(zero_stage: str, optimizer: str) -> str:
    """The option SFT_ZERO_STAGE and SFT_OPTIMIZER name together: ZeRO-2 with adamw-8bit is "2-8bit"."""
    if optimizer == "adamw-8bit" and f"{zero_stage}-8bit" in NAMES:
        return f"{zero_stage}-8bit"
    return zero_stage


def _one_gpu(order: tuple[str, ...]) -> tuple[str, ...]:
    """On one GPU ZeRO-3 shards nothing: it holds what ZeRO-2 holds less ZeRO-2's gradient staging, and its step ran
    5 times slower (Qwen3-4B on one H100: 11.6% MFU against the H200's 60% at ZeRO-2, docs/benchmarks.md), so
    ZeRO-2 with 8-bit state comes before it."""
    rest = [n for n in order if n != "3"]
    at = rest.index("3-8bit")
    return (*rest[:at], "3", *rest[at:])


def preference(world: int) -> tuple[str, ...]:
    """The options auto tries, in order, for a job of `world` ranks."""
    return _one_gpu(PREFERENCE) if world == 1 else PREFERENCE


def next_after(name: str, optimizer: str = "auto", world: int = 2) -> str | None:
    """The option the probe escalates to from `name` once it ran out of memory, that SFT_OPTIMIZER allows: the next
    in TABLE (on one GPU, ZeRO-3 after the 8-bit ZeRO-1 and 2) of no lower a stage; from 8-bit state, no full
    precision again but offload (DeepSpeed's CPU Adam). None after the last."""
    order = _one_gpu(NAMES) if world == 1 else NAMES
    here = get(name)
    later = (get(n) for n in order[order.index(name) + 1:])
    return next((s.name for s in later if s.zero >= here.zero and allowed(s.name, optimizer)
                 and not (here.eight_bit and not s.eight_bit and not s.offload)), None)


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


def of_config(config: dict[str, Any], optimizer: str = "auto") -> Stage:
    """The option a DeepSpeed config amounts to with SFT_OPTIMIZER's value, named as SFT_ZERO_STAGE names it (a
    user's file may name one the table lacks, such as "2-offload": it gets a Stage of its own, with no shipped
    file)."""
    zero = config.get("zero_optimization") or {}

    def offloaded(key: str) -> bool:
        return (zero.get(key) or {}).get("device", "none") not in ("none", None)

    number, offloads, params = int(zero.get("stage", 0)), offloaded("offload_optimizer"), offloaded("offload_param")
    name = f"{number}-offload-all" if params else f"{number}-offload" if offloads else str(number)
    name = named(name, optimizer)
    return get(name) if name in NAMES else Stage(name, number, offloads or params, params, "")


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
