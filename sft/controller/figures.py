"""The figures of a run of the ranks: speed, memory on every rank, and what the full run will take.

The probe is the seed's 50-step timing run, made by the same code as the real run with
save_strategy="no". Its speed is taken in the steady state: the first steps pay for kernel
compilation, allocator growth and DeepSpeed's first all-gathers, and would skew a projection.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..handoff import RankReport
from ..planner import disk
from ..planner.budget import Overheads, Projection
from ..settings import Settings
from ..units import gib

# Steps left out before the steady state: on a fresh machine the first launch compiles flex attention's
# and Liger's kernels during step 2 and recompiles for new shapes in step 4 (docs/speed.md).
WARMUP_STEPS = 4
# A step this many times the steady window's median is a stall, not the steady state, and is timed apart: a
# recompilation for a shape not seen before (a compiled probe recompiled its layers for a packed batch with one
# attention block fewer than the others, one step as long as dozens, which halved the probe's tokens/s; measured:
# docs/speed.md, 'a recompiling step had halved a probe's figure'), or a checkpoint's save in a training run. Its
# time beyond the steady rate is a one-off cost, counted once with the warm-up (the compile cache spares a later
# launch most of it).
STALL_FACTOR = 3.0


def _warmup_steps(count: int) -> int:
    return min(max(WARMUP_STEPS, count // 10), count - 2)


def steady_rates(steps: list[list[float]]) -> dict[str, float] | None:
    """Seconds per step and tokens/s over the steady state: after the first 10% (at least WARMUP_STEPS)
    steps, while at least 2 are left, without stalls (STALL_FACTOR), whose time beyond the steady rate is
    `stall_seconds` (when there were any).

    `steps`: (step, time, tokens) at each optimizer step. The probe and the full run are both measured
    here, so the probe's check against the run compares like with like.
    """
    if len(steps) < 3:
        return None
    window = steps[_warmup_steps(len(steps)) - 1:]
    spans = [(t1 - t0, n1 - n0, s1 - s0) for (s0, t0, n0), (s1, t1, n1) in zip(window, window[1:])]
    typical = statistics.median(seconds / count for seconds, _, count in spans)
    kept = [span for span in spans if span[0] <= STALL_FACTOR * typical * span[2]]
    seconds, tokens, count = (sum(column) for column in zip(*kept))
    out = {"seconds_per_step": round(seconds / count, 4), "tokens_per_second": round(tokens / seconds, 1)}
    if stalls := [span for span in spans if span not in kept]:
        out["stall_seconds"] = round(sum(t - n * seconds / count for t, _, n in stalls), 1)
    return out


def warmup_seconds(main: RankReport, rates: dict[str, float] | None) -> float | None:
    """What the first steps cost beyond the steady rate (compilation, allocator growth, first all-gathers), and
    the stalls' after them (a recompilation)."""
    if not rates or main.train_began is None:
        return None
    step, at, _ = main.steps[_warmup_steps(len(main.steps)) - 1]
    first = max(at - main.train_began - step * rates["seconds_per_step"], 0.0)
    return round(first + rates.get("stall_seconds", 0.0), 1)


def figures(reports: list[RankReport], s: Settings, overheads: Overheads | None = None,
            started_at: float | None = None, eval_every: int | None = None) -> dict[str, Any]:
    """Probe figures from the ranks' reports (rank 0 holds the step times); `overheads`: what the run spends
    besides its steps (saves, the final model), for the projection; started_at: when the job began
    (time.time()), for the seconds a user waits until the first step; eval_every: the run evaluates every
    this many steps and at the end (0: with each checkpoint saved by time; None: it does not)."""
    reports = sorted(reports, key=lambda r: r.rank)
    main = reports[0]
    out: dict[str, Any] = {
        "steps": main.global_step,
        "world_size": main.world_size,
        "peak_reserved_gib": [gib(r.peak_reserved_bytes) for r in reports],
        "device": main.device,
        "steps_per_epoch": main.steps_per_epoch,
    }
    if any(r.alloc_retries is not None for r in reports):
        out["alloc_retries"] = [r.alloc_retries or 0 for r in reports]
    rates = steady_rates(main.steps)
    out.update(rates or {})
    if eval_every == 0:  # with each checkpoint saved by time: as many steps apart as they are
        eval_every = save_every(s, out.get("seconds_per_step"))
    if eval_every and main.eval_seconds_per_batch is not None:
        out.update(eval_every=eval_every, eval_batches=main.eval_batches,
                   eval_seconds_per_batch=main.eval_seconds_per_batch)
    if (warmup := warmup_seconds(main, rates)) is not None:
        out["warmup_seconds"] = warmup
    if started_at is not None and main.first_step_wall is not None:
        out["seconds_to_first_step"] = round(main.first_step_wall - started_at, 1)
    if started_at is not None and main.train_began_wall is not None:  # the rest of it: the first step, compiled
        out["seconds_to_training_loop"] = round(main.train_began_wall - started_at, 1)
    if (p := projection(out, s, overheads or Overheads())) is not None:
        out.update(total_steps=p.total_steps, train_hours=round(p.train_seconds() / 3600, 3),
                   other_hours=round((p.seconds() - p.train_seconds()) / 3600, 3), projected_hours=round(p.hours(), 3),
                   saves=p.saves(), save_seconds_each=round(p.save_seconds, 1),
                   save_hours=round(p.save_seconds_of() / 3600, 3))
        if s.save_seconds is not None:
            out["save_minutes"] = round(s.save_seconds / 60, 3)
        if p.price_per_hour:
            out["projected_cost"] = round(p.cost(), 2)
        passes, evals = eval_seconds(out, p.total_steps)
        if passes:
            out.update(eval_passes=passes, projected_eval_hours=round(evals / 3600, 3))
    return out


def projection(fig: dict[str, Any], s: Settings, overheads: Overheads, max_steps: int | None = None
               ) -> Projection | None:
    """The run ahead at the probe's steady speed: its steps (max_steps, else SFT_MAX_STEPS, else SFT_EPOCHS'
    worth), their saves and evaluation, the final model; None when the probe timed too few steps."""
    if "seconds_per_step" not in fig or not fig.get("steps_per_epoch"):
        return None
    total = max_steps or (s.max_steps if s.max_steps > 0 else math.ceil(s.epochs * fig["steps_per_epoch"]))
    # the training launch pays the warm-up again, less what the compile cache saves (not counted: the safe side)
    passes, evals = eval_seconds(fig, total)
    return Projection(total, fig["seconds_per_step"], save_every(s, fig["seconds_per_step"]), overheads.save_seconds,
                      overheads.final_seconds, evals if passes else overheads.eval_seconds, s.price_per_hour,
                      fig.get("warmup_seconds", 0.0), disk.end_checkpoint(s.save_steps is not None))


def save_every(s: Settings, seconds_per_step: float | None) -> int:
    """Steps between two checkpoints: SFT_SAVE_STEPS, or SFT_SAVE_MINUTES' worth at the probe's speed."""
    return disk.steps_between_saves(s.save_steps, s.save_seconds, seconds_per_step)


def eval_seconds(fig: dict[str, Any], total: int) -> tuple[int, float]:
    """(passes, seconds) of evaluation over `total` steps, from the probe's timed evaluation batches: every
    eval_every steps and once more at the end, unless the last step is one of them."""
    if not fig.get("eval_every"):
        return 0, 0.0
    passes = total // fig["eval_every"] + (1 if total % fig["eval_every"] else 0)
    return passes, passes * fig["eval_batches"] * fig["eval_seconds_per_batch"]


def against_run(fig: dict[str, Any], train: dict[str, Any]) -> dict[str, Any] | None:
    """The probe as a predictor: its tokens/s and projected hours against the full run's, measured."""
    predicted, steady = fig.get("tokens_per_second"), train.get("steady_tokens_per_second")
    if not predicted or not steady:
        return None
    out = {"probe_tokens_per_second": predicted, "run_steady_tokens_per_second": steady,
           "tokens_per_second_error": round(predicted / steady - 1, 4)}
    if fig.get("train_hours") and train.get("train_runtime"):  # steps against steps: saves are not in runtime
        out["projected_hours"] = fig["train_hours"]
        out["run_hours"] = round(train["train_runtime"] / 3600, 3)
    return out


def against_run_line(check: dict[str, Any]) -> str:
    return (f"probe check: the probe measured {check['probe_tokens_per_second']:,.0f} tokens/s, the full run's steady "
            f"state {check['run_steady_tokens_per_second']:,.0f} ({check['tokens_per_second_error']:+.1%})")


SAVES_SHARE_HINT = 0.25  # checkpoints taking more of the run than this: the log says which cadence would not
SAVES_SHARE_TARGET = 0.10


def checkpoints(fig: dict[str, Any]) -> str:
    """The checkpoints' share of the projected run; where it is large, the SFT_SAVE_STEPS (by time: SFT_SAVE_MINUTES)
    that would hold it to about 10% of the steps' time, and the work a lost machine could then cost. A Qwen3-4B checkpoint took as long to write as
    the 200 steps between two at the README's cadence (measured: docs/speed.md, 'where a one-epoch run's time goes')."""
    each, saves, step = fig["save_seconds_each"], fig["saves"], fig["seconds_per_step"]
    share = fig["save_hours"] / fig["projected_hours"] if fig.get("projected_hours") else 0.0
    text = f"{fig['save_hours']} ({saves} x about {each:.0f} s, estimated: {share:.0%} of the run"
    if not step:
        return text + ")"
    text += f"; each as long as {each / step:,.0f} steps)"
    if share <= SAVES_SHARE_HINT:
        return text
    every = math.ceil(each / (SAVES_SHARE_TARGET * step))
    by_time = "save_minutes" in fig
    if every >= fig["total_steps"]:
        return text + (f": fewer checkpoints ({'SFT_SAVE_MINUTES' if by_time else 'SFT_SAVE_STEPS'}) trade this time "
                       "for what a lost machine can cost")
    minutes = math.ceil(every * step / 60) if by_time else round(every * step / 60)
    setting = f"SFT_SAVE_MINUTES={minutes}" if by_time else f"SFT_SAVE_STEPS={every}"
    return text + (f": {setting} would make them about {SAVES_SHARE_TARGET:.0%} of the steps' time, a "
                   f"checkpoint every {minutes} min (what a lost machine can cost)")


def table(fig: dict[str, Any]) -> str:
    """The probe's figures as a short table for the log."""
    rows = [
        ("steps probed", fig.get("steps")),
        ("ranks", fig.get("world_size")),
        ("tokens/s (non-padding, steady)", fig.get("tokens_per_second", "n/a (too few steps)")),
        ("seconds per step", fig.get("seconds_per_step", "n/a")),
        ("warm-up seconds (beyond steady)", fig.get("warmup_seconds", "n/a")),
        *([("  of which later stalls", f"{fig['stall_seconds']} (steps {STALL_FACTOR:g}x the steady one or "
            "more: a recompilation)")] if fig.get("stall_seconds") else []),
        ("seconds from start to first step", fig.get("seconds_to_first_step", "n/a")),
        *([("  of which to the ranks' training loop", f"{fig['seconds_to_training_loop']} (the decision, the ranks' "
            "imports, the model, DeepSpeed; the rest is the first step and its compilation)")]
          if "seconds_to_training_loop" in fig else []),
        ("peak reserved GiB per rank", ", ".join(f"{g:.2f}" for g in fig["peak_reserved_gib"])),
        ("steps per epoch", fig.get("steps_per_epoch")),
        ("steps to train", fig.get("total_steps", "n/a")),
        ("projected hours", fig.get("projected_hours", "n/a")),
    ]
    if "other_hours" in fig:
        rows.append(("  of which saves, final, warm-up", fig["other_hours"]))
    if fig.get("save_hours"):
        rows.append(("  of which checkpoints", checkpoints(fig)))
    if "eval_passes" in fig:
        rows.append(("  of which evaluation", f"{fig['projected_eval_hours']} h: {fig['eval_passes']} passes of "
                     f"{fig['eval_batches']} batches, {fig['eval_seconds_per_batch']} s each (timed on a few)"))
    if "projected_cost" in fig:
        rows.append(("projected cost", fig["projected_cost"]))
    if any(fig.get("alloc_retries") or []):
        # PyTorch's allocator ran out, freed its cache and retried: the steps that did it stalled
        rows.append(("allocator cache flushes per rank", ", ".join(map(str, fig["alloc_retries"]))))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
