"""The budget gate, carried out after the probe: the planner's call (planner/budget.py) on the probe's projection,
logged with the projection, the cap and the settings that would fit; the run then refused, capped or let be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..console import say
from ..planner.budget import Budget, BudgetCall, Overheads, Projection, gate
from ..planner.deadline import ASSUMED_SAVE_BYTES_PER_S, ASSUMED_UPLOAD_BYTES_PER_S
from ..planner.decision import Decision
from ..settings import Settings
from .preflight import Needs


def sizes(d: Decision, total_params: int, trainer_args: Mapping[str, Any]) -> tuple[int, int]:
    """Bytes of one checkpoint and of the final model, as preflight sizes the disk for them: from the decision's
    precision, stage and optimizer (a bf16 ZeRO-2 AdamW checkpoint is 16 bytes/param, about what a measured
    Qwen3-4B checkpoint held: docs/speed.md, 'where a one-epoch run's time goes')."""
    needs = Needs.of(d, total_params, 0, trainer_args, end_saves=False)  # sizes alone: final/ written or not
    return round(needs.checkpoint_bytes_per_param * total_params), needs.final_bytes_per_param * total_params


def overheads(d: Decision, total_params: int, trainer_args: Mapping[str, Any], uploads: bool) -> Overheads:
    """What a run of this decision spends besides its steps, estimated from the sizes it writes (the probe saves
    nothing)."""
    checkpoint, final = sizes(d, total_params, trainer_args)
    final_s = final / ASSUMED_SAVE_BYTES_PER_S + (final / ASSUMED_UPLOAD_BYTES_PER_S if uploads else 0.0)
    return Overheads(save_seconds=checkpoint / ASSUMED_SAVE_BYTES_PER_S, final_seconds=final_s)


def check(s: Settings, p: Projection | None, ranks: int) -> BudgetCall:
    """The gate's call on the probe's projection (None, e.g. too few steps timed: refused when capped)."""
    budget = Budget(s.max_hours, s.max_cost, s.budget_action)
    if p is None:
        if budget.capped:
            return BudgetCall("refuse", "the probe timed too few steps to project the run against "
                                        f"{budget.text()}: raise SFT_PROBE_STEPS")
        return BudgetCall("none", "no SFT_MAX_HOURS or SFT_MAX_COST")
    return gate(p, budget, ranks)


def report(call: BudgetCall, refusing: bool = True) -> None:
    """The call in the log: refused with what would fit, truncated with the steps, or within the cap
    (`refusing` False: the probe command, which only tells what a run would do)."""
    if call.verdict == "none":
        return
    head = "error: budget: " if call.verdict == "refuse" and refusing else "budget: "
    say(head + call.reason)
    if call.fits and call.verdict != "within":
        say("budget: settings that would fit:\n" + "\n".join(f"  - {f}" for f in call.fits))
