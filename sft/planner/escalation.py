"""After the probe ran out of GPU memory, or left less free than the planner's margin: the next decision to probe.

The order, where the job chose (auto): checkpointing on, timed by a batch search against fewer rows a pass without
it (the same rows a step) where the plan fits those; then the checkpoints in host memory; then the next option of
stages.OPTIONS that SFT_OPTIMIZER allows, its activations and split planned afresh (decide.at_next_stage). A choice
of the user's is never changed: the job names the setting to change instead.
"""

from __future__ import annotations

import dataclasses

from .. import stages
from ..handoff import Split
from . import optimizer, rules
from .decide import at_next_stage, row_for, with_split
from .decision import Decision
from .inputs import Inputs


def escalate(inputs: Inputs, d: Decision, why: str) -> tuple[Decision | None, str]:
    """After the probe ran out of memory: (the next decision, what changed), or (None, what to try)."""
    s = inputs.settings
    if s.gradient_checkpointing == "auto" and not d.split.offload_activations and (
            d.ranks.on_gpu or not d.split.gradient_checkpointing):
        on = d.split.gradient_checkpointing
        split = dataclasses.replace(d.split, gradient_checkpointing=True, offload_activations=on)
        fewer = None if on or not d.ranks.on_gpu else _fewer_rows_a_pass(inputs, d)
        before = d.split.text()
        d = with_split(inputs, d, split)
        change = "offloading the checkpoints to host memory" if on else "turning gradient checkpointing on"
        level = "offload" if on else "on"
        d = dataclasses.replace(d, reasons={**d.reasons, "gradient_checkpointing": f"{level}, auto: {why}"})
        if fewer is not None:  # which of the two is faster no memory rule decides (rules.batch_candidates): time both
            d = dataclasses.replace(d, search=(split, fewer), reasons={**d.reasons, "batch_search": (
                f"times 2 splits of {split.rows} rows per step ({why} with {before}): {split.text()}; {fewer.text()}")})
            change = f"timing {split.text()} against {fewer.text()}"
        return d, change
    nxt = (stages.next_after(d.stage.name, optimizer.optimizer_choice(s), d.ranks.world)
           if d.stage.name in stages.NAMES else None)
    if rules.stage_source(inputs) is not None or nxt is None:
        return None, f"try SFT_ZERO_STAGE={nxt}" if nxt else "lower SFT_MICRO_BATCH or SFT_MAX_LENGTH"
    stage = stages.get(nxt)
    d = at_next_stage(inputs, d, stage, stages.shipped_config(nxt), f"{stage.label}, auto: {why} with {d.stage.label}")
    return d, f"moving to ZeRO {nxt}"


def _fewer_rows_a_pass(inputs: Inputs, d: Decision) -> Split | None:
    """Once the probe, checkpointing off, ran out of memory or left too little free: the largest smaller micro-batch
    (the same rows a step, in more passes) that the plan fits without checkpointing, where the job chose the split
    and may time it. Recomputing the activations costs every pass a third more compute, a pass of fewer rows some
    speed: which costs more was measured both ways (Qwen3-4B on one H200, docs/speed.md)."""
    split, s = d.split, inputs.settings
    if s.micro_batch is not None or s.batch_search == "false" or d.reshard is not None or d.searched:
        return None
    for micro in range(split.micro_batch - 1, 0, -1):
        fewer = Split(micro, split.rows // micro, False)
        if split.rows % micro == 0 and row_for(inputs, d, fewer).fits:
            return fewer
    return None
