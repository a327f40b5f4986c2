"""The budget gate: after the probe, whether the projected run fits SFT_MAX_HOURS / SFT_MAX_COST, and what to
do when it does not (SFT_BUDGET_ACTION). Pure: the controller builds the Projection from the probe's figures
(controller/figures.py) and carries the call out (refuse before the epoch, or train the steps that fit).

The projection counts what the run will take from the gate on: the steps, every checkpoint's save,
evaluation, and at the end the final model's save and upload (checkpoint uploads run beside training and
take no time of their own). The start and the probe, spent before the gate, are not counted: a cap limits
what can still be decided, and a resumed start, which does not probe, is not gated again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .disk import saves_left

ACTIONS = ("refuse", "truncate")


@dataclass(frozen=True)
class Overheads:
    """What a run spends besides its steps, in seconds (estimated by the controller from the model's size)."""

    save_seconds: float = 0.0  # one checkpoint's save
    final_seconds: float = 0.0  # the final model's save, and its upload with a Hub repo
    eval_seconds: float = 0.0  # evaluation over the whole run


@dataclass(frozen=True)
class Projection:
    """The run ahead as the probe measured it; seconds unless named otherwise."""

    total_steps: int
    seconds_per_step: float
    save_steps: int  # a checkpoint every this many steps (SFT_SAVE_MINUTES: its worth at the probe's speed)
    save_seconds: float  # one checkpoint's save
    final_seconds: float  # the final model's save, and its upload with a Hub repo
    eval_seconds: float = 0.0  # evaluation over the whole run (none configured: 0)
    price_per_hour: float | None = None
    warmup_seconds: float = 0.0  # what the first steps cost beyond the steady rate (compilation), paid once
    end_checkpoint: bool = True  # the last step saves a checkpoint (disk.end_checkpoint); else the model alone

    def seconds(self, steps: int | None = None) -> float:
        n = self.total_steps if steps is None else steps
        evals = self.eval_seconds * n / self.total_steps if self.total_steps else 0.0
        warmup = self.warmup_seconds if n else 0.0
        return self.train_seconds(n) + self.save_seconds_of(n) + evals + self.final_seconds + warmup

    def saves(self, steps: int | None = None) -> int:
        """The checkpoints the run writes in `steps` steps: every save_steps, and one at the last step where the end
        saves one."""
        return saves_left(0, self.total_steps if steps is None else steps, self.save_steps, self.end_checkpoint)

    def save_seconds_of(self, steps: int | None = None) -> float:
        return self.saves(steps) * self.save_seconds

    def train_seconds(self, steps: int | None = None) -> float:
        return (self.total_steps if steps is None else steps) * self.seconds_per_step

    def hours(self, steps: int | None = None) -> float:
        return self.seconds(steps) / 3600

    def cost(self, steps: int | None = None) -> float | None:
        return None if self.price_per_hour is None else self.hours(steps) * self.price_per_hour

    def text(self, steps: int | None = None) -> str:
        cost, hours = self.cost(steps), self.hours(steps)
        shown = f"{hours:.2f} h" if hours >= 1 else f"{hours * 60:.1f} min"
        return shown + (f", {cost:.2f} at {self.price_per_hour:g} per hour" if cost else "")


@dataclass(frozen=True)
class Budget:
    max_hours: float | None = None
    max_cost: float | None = None
    action: str = "refuse"

    @property
    def capped(self) -> bool:
        return self.max_hours is not None or self.max_cost is not None

    def text(self) -> str:
        caps = [f"SFT_MAX_HOURS={self.max_hours:g}"] if self.max_hours is not None else []
        return ", ".join(caps + ([f"SFT_MAX_COST={self.max_cost:g}"] if self.max_cost is not None else []))


@dataclass(frozen=True)
class BudgetCall:
    """The gate's answer: within (or no cap), refuse, or truncate to max_steps; why; settings that would fit."""

    verdict: str  # "none", "within", "refuse", "truncate"
    reason: str
    max_steps: int | None = None  # truncate: the steps that fit
    fits: tuple[str, ...] = ()


def cap_seconds(p: Projection, b: Budget) -> float:
    """The tightest cap, in seconds of this machine (a cost cap is hours at SFT_PRICE_PER_HOUR)."""
    caps = [b.max_hours * 3600] if b.max_hours is not None else []
    if b.max_cost is not None and p.price_per_hour:
        caps.append(b.max_cost / p.price_per_hour * 3600)
    return min(caps)


def steps_that_fit(p: Projection, cap: float) -> int:
    """The most steps whose projection stays within `cap` seconds (0: not even one)."""
    per_step = p.seconds_per_step + p.save_seconds / p.save_steps + (
        p.eval_seconds / p.total_steps if p.total_steps else 0.0)
    n = min(p.total_steps, max(0, math.floor((cap - p.final_seconds) / per_step)))
    # the estimate spreads saves evenly; the projection counts whole ones: step to the exact answer
    while n > 0 and p.seconds(n) > cap:
        n -= 1
    while n < p.total_steps and p.seconds(n + 1) <= cap:
        n += 1
    return n


def gate(p: Projection, b: Budget, ranks: int) -> BudgetCall:
    """Whether the run fits the caps; if not, what SFT_BUDGET_ACTION says to do and what would fit."""
    if not b.capped:
        return BudgetCall("none", "no SFT_MAX_HOURS or SFT_MAX_COST")
    cap = cap_seconds(p, b)
    if p.seconds() <= cap:
        return BudgetCall("within", f"the projected run ({p.text()}) fits {b.text()}")
    n = steps_that_fit(p, cap)
    over = f"the projected run ({p.total_steps} steps: {p.text()}) exceeds {b.text()}"
    fits = _what_fits(p, b, n, ranks)
    if n < 1:
        return BudgetCall("refuse", f"{over}, and not even one step fits", None, fits)
    if b.action == "truncate":
        return BudgetCall("truncate", f"{over}: training the {n} steps that fit ({p.text(n)}) "
                                      "(SFT_BUDGET_ACTION=truncate)", n, fits)
    return BudgetCall("refuse", over, None, fits)


def _what_fits(p: Projection, b: Budget, n: int, ranks: int) -> tuple[str, ...]:
    fits = []
    if n >= 1:
        fits.append(f"SFT_MAX_STEPS={n} (the steps that fit: {p.text(n)})")
        if b.action != "truncate":
            fits.append("SFT_BUDGET_ACTION=truncate (train those steps and finish with the final model)")
    if b.max_hours is not None and p.hours() > b.max_hours:
        fixed = p.final_seconds
        scaled = p.seconds() - fixed  # what more GPUs shorten, if the speed grows with them
        if b.max_hours * 3600 > fixed and scaled > 0:
            gpus = math.ceil(ranks * scaled / (b.max_hours * 3600 - fixed))
            fits.append(f"about {gpus} GPUs instead of {ranks}, if the speed grows with the GPUs (the cost does "
                        "not fall)")
        fits.append(f"SFT_MAX_HOURS={math.ceil(p.hours() * 100) / 100:g} (the whole run)")
    cost = p.cost()
    if b.max_cost is not None and cost is not None and cost > b.max_cost:
        fits.append(f"SFT_MAX_COST={math.ceil(cost * 100) / 100:g} (the whole run)")
    return tuple(fits)
