"""The probe's figures: speed, memory on every rank, and what the full run will take.

The probe is the seed's 50-step timing run, made by the same code as the real run with
save_strategy="no". Its speed is taken in the steady state: the first steps pay for kernel
compilation, allocator growth and DeepSpeed's first all-gathers, and would skew a projection.
"""

from __future__ import annotations

import math
from typing import Any

from .plan import GIB


# Steps left out before the steady state: on a fresh machine the first launch compiles flex attention's
# and Liger's kernels during step 2 and recompiles for new shapes in step 4 (measured on one H200,
# Qwen3-4B, defaults: 16.2 s and 1.16 s against 0.62-0.65 s for the others; with the compile caches
# warm, 3.3 s and 0.62 s). Timed from step 3, that launch read 5.8% slower than a warm one; from step 5, 2.0%.
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


def figures(reports: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """Probe figures from the ranks' reports (rank 0 holds the step times)."""
    main = next(r for r in reports if r["rank"] == 0)
    out: dict[str, Any] = {
        "steps": main.get("global_step"),
        "world_size": main["world_size"],
        "peak_reserved_gib": [round(r["peak_reserved_bytes"] / GIB, 2) for r in sorted(reports, key=lambda r: r["rank"])],
        "device": main.get("device"),
        "steps_per_epoch": main.get("steps_per_epoch"),
    }
    if any("alloc_retries" in r for r in reports):
        out["alloc_retries"] = [r.get("alloc_retries", 0) for r in sorted(reports, key=lambda r: r["rank"])]
    out.update(steady_rates(main["steps"]) or {})
    out.update(projection(out, settings))
    return out


def projection(fig: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Steps, hours and cost of the full run at the probe's steady speed."""
    if "seconds_per_step" not in fig or not fig.get("steps_per_epoch"):
        return {}
    total = settings["max_steps"] if settings["max_steps"] > 0 else math.ceil(
        settings["epochs"] * fig["steps_per_epoch"])
    hours = total * fig["seconds_per_step"] / 3600
    out = {"total_steps": total, "projected_hours": round(hours, 3)}
    if settings.get("price_per_hour"):
        out["projected_cost"] = round(hours * settings["price_per_hour"], 2)
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
