"""TRL's SFTConfig for a rank, from the RunSpec: the arguments the controller decided (sft/planner/arguments.py), the
objects among them made here; and the DeepSpeed config as the Trainer fills it, which `entrypoint.py config` shows."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

from ..handoff import RunSpec


def trainer_arguments(spec: RunSpec, in_rank: bool = True):
    """SFTConfig from the spec's arguments. `in_rank=False` (`entrypoint.py config`): no rank's process state to use."""
    from trl import SFTConfig

    args = dict(spec.trainer)
    args["parallelism_config"] = sequence_parallelism(args["parallelism_config"])
    if not in_rank:
        args["accelerator_config"] = {**args["accelerator_config"], "use_configured_state": False}
    return SFTConfig(**args)


def sequence_parallelism(asked: dict[str, Any] | None):
    """Accelerate's ParallelismConfig for DeepSpeed's Ulysses, as the arguments describe it (None: off)."""
    if asked is None:
        return None
    from accelerate.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig

    return ParallelismConfig(sp_backend=asked["sp_backend"], sp_size=asked["sp_size"],
                             dp_replicate_size=asked["dp_replicate_size"],
                             sp_handler=DeepSpeedSequenceParallelConfig(
                                 sp_attn_implementation=asked["sp_attn_implementation"]))


def regional_compilation() -> None:
    """Compile each decoder layer, not the whole model: accelerate's regional compilation (its
    compile_regions_deepspeed, which compiles the DeepSpeed engine's module in place). One layer's graph
    serves all of them, the model's forward (its mask, TRL's fused LM head) stays eager, and on an H200 it
    ran the defaults 18% faster than uncompiled with Liger's kernels, where the whole model compiled through
    DeepSpeed's engine.compile had not finished warming up in 270 s (docs/speed.md, 2026-12-02). Accelerate
    reads it from the environment only, when the Trainer makes its Accelerator: call it in the rank, before."""
    os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "1"


def filled_ds_config(config: dict[str, Any], args: Any, world_size: int, model_config: Any,
                     total_steps: int) -> dict[str, Any]:
    """The config with every "auto" filled as the Trainer fills it, by transformers' own code.

    `args` is the run's SFTConfig made without a DeepSpeed config (so no process group starts here);
    its world size is this process's, so the run's is given.
    """
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class _RunArgs:
        def __init__(self):
            self.world_size = world_size

        def __getattr__(self, name):
            return getattr(args, name)

    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    hf.trainer_config_process(_RunArgs())
    hf.trainer_config_finalize(_RunArgs(), SimpleNamespace(config=model_config), total_steps)
    return hf.config
