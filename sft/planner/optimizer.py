"""Which optimizer state the job may hold: SFT_OPTIMIZER against SFT_TRAINER_ARGS' optim, and the decision's line
about it. The options themselves (full-precision or 8-bit AdamW state at each stage) are stages.TABLE's. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import stages
from ..settings import Settings
from ..stages import Stage
from .plan import Plan


def optimizer_choice(s: Settings) -> str:
    """What auto and the escalation may pick from (stages.allowed): SFT_OPTIMIZER; with an optimizer of
    SFT_TRAINER_ARGS' own (checked: then SFT_OPTIMIZER is auto), full-precision options only, as that optimizer's
    state is planned (at AdamW's bytes)."""
    if s.optimizer == "auto" and "optim" in s.extra_trainer_args:
        return "adamw"
    return s.optimizer


def optimizer_text(s: Settings, stage: Stage, ds_config: Mapping[str, Any]) -> str:
    """The decision's line: the optimizer the ranks run, the precision of its state, and who chose it."""
    if s.ds_config is not None and ds_config.get("optimizer"):
        return f"{ds_config['optimizer'].get('type', 'the optimizer')}, as your DeepSpeed file says (SFT_DS_CONFIG)"
    if stage.offload:  # the shipped offload configs name DeepSpeed's optimizer, which wins over the Trainer's
        return "AdamW, full precision: DeepSpeed's CPU Adam on the host, fp32 moments (the offload config's own)"
    if "optim" in s.extra_trainer_args:
        return f"{s.extra_trainer_args['optim']}, as SFT_TRAINER_ARGS says"
    who = "SFT_OPTIMIZER" if s.optimizer != "auto" else "auto, with the option"
    if stage.eight_bit:
        return (f"8-bit AdamW ({stage.optimizer}: bitsandbytes, each moment in 8 bits by blocks of 256; fp32 master "
                f"weights kept by DeepSpeed) ({who})")
    return f"AdamW, full precision: torch's fused AdamW (adamw_torch_fused), fp32 moments ({who})"


def full_precision_does_not_fit(p: Plan) -> str:
    """Why auto took 8-bit state: the full-precision options on the GPUs, and offload's step."""
    full = [r for r in p.rows if not stages.get(r.option).eight_bit and not stages.get(r.option).offload]
    least = min(full, key=lambda r: r.peak)
    return (f"no option with full-precision AdamW state fits the GPUs (the least, {stages.get(least.option).label}: "
            f"{least.why}), and with it offloaded each step waits for the host's Adam; SFT_OPTIMIZER=adamw keeps "
            "full precision")
