"""The figures of a run of the ranks: speed, memory on every rank, and what the full run will take.

The probe is the seed's 50-step timing run, made by the same code as the real run with
save_strategy="no". Its speed is taken in the steady state: the first steps pay for kernel
compilation, allocator growth and DeepSpeed's first all-gathers, and would skew a projection.
"""

from __future__ import annotations

import math
from typing import Any

from ..handoff import RankReport
from ..settings import Settings
from ..units import gib

# Steps left out before the steady state: on a fresh machine the first launch compiles flex attention's
# and Liger's kernels during step 2 and recompiles for new shapes in step 4 (docs/speed.md).
WARMUP_STEPS = 4


def steady_rates(steps: list[list[float]]) -> dict[str, float] | None:
    """Seconds per step and tokens/s over the steady state: after the first 10% (at least WARMUP_STEPS)
    steps, while at least 2 are left.

    `steps`: (step, time, tokens) at each optimizer step. The probe and the full run are both measured
    here, so the probe's check against the run compares like with like.
    """
    if len(steps) < 3:
        return None
    skip = min(max(WARMUP_STEPS, len(steps) // 10), len(steps) - 2)
    (s0, t0, n0), (s1, t1, n1) = steps[skip - 1], steps[-1]
    return {"seconds_per_step": round((t1 - t0) / (s1 - s0), 4), "tokens_per_second": round((n1 - n0) / (t1 - t0), 1)}


def warmup_seconds(main: RankReport, rates: dict[str, float] | None) -> float | None:
    """What the first steps cost beyond the steady rate: compilation, allocator growth, first all-gathers."""
    if not rates or main.train_began is None:
        return None
    skip = min(max(WARMUP_STEPS, len(main.steps) // 10), len(main.steps) - 2)
    step, at, _ = main.steps[skip - 1]
    return round(max(at - main.train_began - step * rates["seconds_per_step"], 0.0), 1)


def figures(reports: list[RankReport], s: Settings, started_at: float | None = None) -> dict[str, Any]:
    """Probe figures from the ranks' reports (rank 0 holds the step times); started_at: when the job began
    (time.time()), for the seconds a user waits until the first step."""
    reports = sorted(reports, key=lambda r: r.rank)
    main = reports[0]
    out: dict[str, Any] = {
        "steps": main.global_step,
        "world_size": main.world_size,
        "peak_reserved_gib": [gib(r.peak_reserved_bytes) for r in reports],
        "device": main.device,
        "steps_per_epoch": main.steps_per_epoch,
        "long_rows": main.long_rows,
    }
    if any(r.alloc_retries is not None for r in reports):
        out["alloc_retries"] = [r.alloc_retries or 0 for r in reports]
    rates = steady_rates(main.steps)
    out.update(rates or {})
    if (warmup := warmup_seconds(main, rates)) is not None:
        out["warmup_seconds"] = warmup
    if started_at is not None and main.first_step_wall is not None:
        out["seconds_to_first_step"] = round(main.first_step_wall - started_at, 1)
    out.update(projection(out, s))
    return out


def projection(fig: dict[str, Any], s: Settings) -> dict[str, Any]:
    """Steps, hours and cost of the full run at the probe's steady speed."""
    if "seconds_per_step" not in fig or not fig.get("steps_per_epoch"):
        return {}
    total = s.max_steps if s.max_steps > 0 else math.ceil(s.epochs * fig["steps_per_epoch"])
    # the training launch pays the warm-up again, less what the compile cache saves (not counted: the safe side)
    hours = (total * fig["seconds_per_step"] + fig.get("warmup_seconds", 0)) / 3600
    out = {"total_steps": total, "projected_hours": round(hours, 3)}
    if s.price_per_hour:
        out["projected_cost"] = round(hours * s.price_per_hour, 2)
    return out


def against_run(fig: dict[str, Any], train: dict[str, Any]) -> dict[str, Any] | None:
    """The probe as a predictor: its tokens/s and projected hours against the full run's, measured."""
    predicted, steady = fig.get("tokens_per_second"), train.get("steady_tokens_per_second")
    if not predicted or not steady:
        return None
    out = {"probe_tokens_per_second": predicted, "run_steady_tokens_per_second": steady,
           "tokens_per_second_error": round(predicted / steady - 1, 4)}
    if fig.get("projected_hours") and train.get("train_runtime"):
        out["projected_hours"] = fig["projected_hours"]
        out["run_hours"] = round(train["train_runtime"] / 3600, 3)
    return out


def against_run_line(check: dict[str, Any]) -> str:
    return (f"probe check: the probe measured {check['probe_tokens_per_second']:,.0f} tokens/s, the full run's steady "
            f"state {check['run_steady_tokens_per_second']:,.0f} ({check['tokens_per_second_error']:+.1%})")


def table(fig: dict[str, Any]) -> str:
    """The probe's figures as a short table for the log."""
    rows = [
        ("steps probed", fig.get("steps")),
        ("ranks", fig.get("world_size")),
        ("tokens/s (non-padding, steady)", fig.get("tokens_per_second", "n/a (too few steps)")),
        ("seconds per step", fig.get("seconds_per_step", "n/a")),
        ("warm-up seconds (beyond steady)", fig.get("warmup_seconds", "n/a")),
        ("seconds from start to first step", fig.get("seconds_to_first_step", "n/a")),
        ("peak reserved GiB per rank", ", ".join(f"{g:.2f}" for g in fig["peak_reserved_gib"])),
        ("steps per epoch", fig.get("steps_per_epoch")),
        ("steps to train", fig.get("total_steps", "n/a")),
        ("projected hours", fig.get("projected_hours", "n/a")),
    ]
    if "projected_cost" in fig:
        rows.append(("projected cost", fig["projected_cost"]))
    if any(fig.get("alloc_retries") or []):
        # PyTorch's allocator ran out, freed its cache and retried: the steps that did it stalled
        rows.append(("allocator cache flushes per rank", ", ".join(map(str, fig["alloc_retries"]))))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
