"""After the probe ran out of GPU memory, or left less free than the planner's margin: the next decision to probe.

The order, where the job chose (auto): fewer rows a pass with checkpointing still off, the same rows a step; then
checkpointing on, back to the most rows a pass that fit with it; then its checkpoints in host memory; then the next
option of stages.OPTIONS that SFT_OPTIMIZER allows. A choice of the user's is never changed: the job names the
setting to change instead.
"""

from __future__ import annotations

import dataclasses

from .. import stages
from ..handoff import Split
from ..units import GIB
from . import optimizer, rules
from .decide import _replace, _row, _with_split, _with_stage
from .decision import Decision
from .inputs import Inputs


def escalate(inputs: Inputs, d: Decision, why: str) -> tuple[Decision | None, str]:
    """After the probe ran out of memory: (the next decision, what changed), or (None, what to try)."""
    s = inputs.settings
    if s.gradient_checkpointing == "auto" and d.ranks.on_gpu and (smaller := _fewer_rows_a_pass(inputs, d)):
        before = d.split.text()
        d = _replace(_with_split(inputs, d, smaller), searched=True)  # checkpoints record it: a resume keeps it
        why_split = f"{smaller.text()}, auto: {why} with {before}; fewer rows a pass, the same rows a step"
        return _replace(d, reasons={**d.reasons, "split": why_split, "gradient_checkpointing": "off, auto: "
                                    f"{smaller.text()} fits without it ({d.row.peak / GIB:.2f} GiB predicted)"}), \
            f"passes of {smaller.micro_batch} row(s), {smaller.grad_accum} a step"
    if s.gradient_checkpointing == "auto" and not d.split.offload_activations and (
            d.ranks.on_gpu or not d.split.gradient_checkpointing):
        on = d.split.gradient_checkpointing
        split = dataclasses.replace(d.split, gradient_checkpointing=True, offload_activations=on)
        if not on and d.ranks.on_gpu and s.micro_batch is None and d.reshard is None:
            split = _most_rows_a_pass(inputs, d, split)  # back to more rows a pass, where fewer did not fit either
        d = _with_split(inputs, d, split)
        change = "offloading the checkpoints to host memory" if on else "turning gradient checkpointing on"
        level = "offload" if on else "on"
        return _replace(d, reasons={**d.reasons, "gradient_checkpointing": f"{level}, auto: {why}"}), change
    nxt = stages.next_after(d.stage.name, optimizer.optimizer_choice(s), d.ranks.world) if d.stage.name in stages.NAMES else None
    if rules.stage_source(inputs) is not None or nxt is None:
        return None, f"try SFT_ZERO_STAGE={nxt}" if nxt else "lower SFT_MICRO_BATCH or SFT_MAX_LENGTH"
    stage = stages.get(nxt)
    d = _with_stage(inputs, d, stage, stages.shipped_config(nxt), f"{stage.label}, auto: {why} with {d.stage.label}")
    return d, f"moving to ZeRO {nxt}"


def _fewer_rows_a_pass(inputs: Inputs, d: Decision) -> Split | None:
    """After the probe, checkpointing off, ran out of memory or left too little free: the largest smaller micro-batch
    (the same rows a step, in more passes) that the plan fits without checkpointing, where the job chose the split.
    Recomputing the activations costs every pass a third more compute; a pass of fewer rows costs less (Qwen3-4B on
    one H200: 2 x 2 rows without checkpointing 11,560 tokens/s, 4 x 1 with it 8,784; docs/speed.md)."""
    split, s = d.split, inputs.settings
    if split.gradient_checkpointing or s.micro_batch is not None or d.reshard is not None or d.searched:
        return None
    for micro in range(split.micro_batch - 1, 0, -1):
        fewer = Split(micro, split.rows // micro, False)
        if split.rows % micro == 0 and _row(inputs, d, fewer).fits:
            return fewer
    return None


def _most_rows_a_pass(inputs: Inputs, d: Decision, split: Split) -> Split:
    """`split` (checkpointing on) with the most rows a pass that the plan fits, the same rows a step."""
    rows = split.rows
    fitting = (dataclasses.replace(split, micro_batch=m, grad_accum=rows // m) for m in range(rows, split.micro_batch, -1)
               if rows % m == 0)
    return next((f for f in fitting if _row(inputs, d, f).fits), split)
