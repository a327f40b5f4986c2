"""The probe, carried out: the batch search's short runs, then the timing run, escalating on out-of-memory.

What to time, what to adopt and where to escalate are the decision's (planner/decide.py, escalation.py); this module
runs the ranks, reads their reports and hands the measurements back to it. Where the decision says so
(Decision.probe_goes_on), the timing run is the training's own launch, left waiting after its steps
(runs.Held): the job then says whether it goes on as the training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import exitcodes
from ..console import say
from ..events import Escalated, ProbeTry
from ..handoff import RankReport, Split, write_json
from ..planner import decide, escalation
from ..planner.decision import Decision
from ..planner.inputs import Inputs
from ..planner.plan import GPU_FREE_FRACTION
from ..units import GIB
from . import figures
from .runs import Held, Runner

BATCH_SEARCH_STEPS = 12  # steps per split: steady_rates times the last 8 (figures.WARMUP_STEPS)


class ProbeOutOfMemory(Exception):
    """The ranks ran out of GPU memory, or left less free than the planner's margin."""


@dataclass
class Outcome:
    """What the probe ends with: its exit code, the decision it leaves, and what it measured."""

    decision: Decision
    code: int = exitcodes.DONE
    figures: dict[str, Any] | None = None
    escalations: list[dict[str, str]] = field(default_factory=list)
    batch_search: dict[str, Any] | None = None
    held: Held | None = None  # the training's launch, waiting after the probe's steps for the job's verdict


def probe(runner: Runner, inputs: Inputs, d: Decision, recheck: Callable[[Decision], int | None],
          train_on: bool = False) -> Outcome:
    """The batch search where the decision asks for one, then the probe; `recheck` preflights an escalation;
    `train_on`: the probe is the training's launch where the decision allows it (not in `entrypoint.py probe`)."""
    outcome = Outcome(d)
    if d.search:
        outcome.code = _search_batch(runner, inputs, outcome)
    while outcome.code == exitcodes.DONE and outcome.figures is None:
        d = outcome.decision
        try:
            outcome.figures, outcome.held = _probe_once(runner, d, train_on and d.probe_goes_on)
        except ProbeOutOfMemory as e:
            nxt, change = escalation.escalate(inputs, d, str(e))
            if nxt is None:
                say(f"error: {e} with ZeRO {d.stage.name}; {change}")
                outcome.code = exitcodes.PROBE_OOM
                break
            say(f"auto: {e} with ZeRO {d.stage.name}; {change} and probing again")
            moved = nxt.stage != d.stage
            before, after = (d.stage.name, nxt.stage.name) if moved else ("checkpointing off", "on")
            outcome.escalations.append({"from": before, "to": after, "why": str(e)})
            runner.events.emit(Escalated(before=before, after=after, why=str(e)))
            outcome.decision = nxt
            outcome.code = recheck(nxt) or exitcodes.DONE
            if outcome.code == exitcodes.DONE and nxt.search:  # checkpointing on against fewer rows a pass
                outcome.code = _search_batch(runner, inputs, outcome)
        except _Failed as e:
            outcome.code = e.code
    return outcome


class _Failed(Exception):
    def __init__(self, code: int):
        self.code = code


def _probe_once(runner: Runner, d: Decision, train_on: bool) -> tuple[dict[str, Any], Held | None]:
    s = runner.s
    where = "the training's launch, waiting after them" if train_on else "a launch of its own"
    say(f"probe: {s.probe_steps} steps with ZeRO {d.stage.name} on {d.ranks.world} rank(s), in {where}")
    held = None
    if train_on:
        spec = runner.spec(d, "train", runner.paths.out, d.max_steps or s.max_steps, hold_at=s.probe_steps)
        held = runner.hold(spec)
    try:
        fig, reports = _timed_run(runner, d, s.probe_steps, "probe", held)
        write_json(runner.paths.run / "probe.json", fig)
        say("probe:\n" + figures.table(fig))
        _check_headroom(reports)
    except (ProbeOutOfMemory, _Failed) as e:
        if held is not None:
            held.end(str(e) or "the probe failed")
        raise
    return fig, held


def _timed_run(runner: Runner, d: Decision, steps: int, name: str, held: Held | None = None
               ) -> tuple[dict[str, Any], list[RankReport]]:
    """Ranks that train `steps` steps and save nothing (or the held training launch's first steps); their
    figures and reports. Raises ProbeOutOfMemory when a rank ran out of memory, _Failed when the run failed or
    was stopped."""
    began = time.monotonic()
    if held is not None:
        code, reports = held.probed()
    else:
        code, reports = runner.run(runner.spec(d, "probe", runner.paths.run / name.replace(" ", "-"), steps))

    def tried(outcome: str, fig: dict[str, Any] | None = None) -> None:
        fig = fig or {}
        runner.events.emit(ProbeTry(what=name, stage=d.stage.name, split=d.split.text(), outcome=outcome,
                                    tokens_per_second=fig.get("tokens_per_second"),
                                    seconds_per_step=fig.get("seconds_per_step"),
                                    wall_seconds=round(time.monotonic() - began, 1)))

    if runner.stopper.requested:
        tried("stopped")
        raise _Failed(exitcodes.STOPPED)
    if code == exitcodes.RANK_OOM or any(r.status == "oom" for r in reports):
        tried("out of memory")
        raise ProbeOutOfMemory(f"the {name} ran out of GPU memory")
    if code != 0 or len(reports) != d.ranks.world or any(r.status != "done" for r in reports):
        tried("failed")
        why = next((f": {r.error}" for r in reports if r.error), "")
        say(f"error: the {name} failed (launcher exit code {code}{why}); see the ranks' output above")
        raise _Failed(exitcodes.PROBE_FAILED)
    # eval_steps None with evaluation: with each checkpoint saved by time (0)
    eval_every = d.data.eval_steps or 0 if d.data and d.data.evaluates else None
    fig = figures.figures(reports, runner.s, runner.overheads(d), runner.started_at, eval_every)
    fig["stage"] = d.stage.name
    tried("ok", fig)
    return fig, reports


def _check_headroom(reports: list[RankReport]) -> None:
    """Measured peak against the card: less free than the planner's margin counts as not fitting."""
    for r in reports:
        if r.total_bytes and r.peak_reserved_bytes > r.total_bytes * (1 - GPU_FREE_FRACTION):
            raise ProbeOutOfMemory(f"rank {r.rank} peaked at {r.peak_reserved_bytes / GIB:.1f} GiB of "
                                   f"{r.total_bytes / GIB:.1f} GiB, less than {GPU_FREE_FRACTION:.0%} free")


def _search_batch(runner: Runner, inputs: Inputs, outcome: Outcome) -> int:
    """Time each split the decision lists in a short run; adopt the fastest that did not run out of memory."""
    d, started = outcome.decision, time.monotonic()
    steps = min(runner.s.probe_steps, BATCH_SEARCH_STEPS)
    say(f"batch search: {len(d.search)} splits of {d.split.rows} rows per step, {steps} steps each, with "
          f"ZeRO {d.stage.name}")
    tries = []
    for split in d.search:
        tried, began = _try_split(runner, inputs, d, split, steps)
        tried["wall_seconds"] = round(time.monotonic() - began, 1)  # what the try cost, model load included
        tries.append(tried)
    outcome.batch_search = {"rows_per_step": d.split.rows, "steps": steps, "tries": tries}
    timed = [t for t in tries if t["tokens_per_second"]]
    if not timed:  # every split failed: the planned one, and the probe's usual escalation
        say("batch search: no split could be timed; probing the planned one")
        return exitcodes.DONE
    best = max(timed, key=lambda t: t["tokens_per_second"])
    outcome.batch_search.update(chosen=best, wall_seconds=round(time.monotonic() - started, 1))
    split = Split(best["micro_batch"], best["grad_accum"], best["gradient_checkpointing"])
    outcome.decision = decide.adopt(inputs, d, split, f"{split.text()}, the fastest the batch search timed")
    say(f"batch search: keeping {split.text()} ({outcome.batch_search['wall_seconds']:.0f} s spent searching)")
    return exitcodes.DONE


def _try_split(runner: Runner, inputs: Inputs, d: Decision, split: Split, steps: int) -> tuple[dict[str, Any], float]:
    tried: dict[str, Any] = split.to_dict()
    began = time.monotonic()
    try:
        fig, reports = _timed_run(runner, decide.adopt(inputs, d, split, "a batch search try"), steps, "batch search")
        _check_headroom(reports)
    except ProbeOutOfMemory as e:
        fig, tried["out_of_memory"] = {}, str(e)
    tried["tokens_per_second"] = fig.get("tokens_per_second")
    tried["peak_reserved_gib"] = fig.get("peak_reserved_gib")
    say(f"batch search: {split.text()}: " + (f"{tried['tokens_per_second']:,.0f} tokens/s" if
          tried["tokens_per_second"] else tried.get("out_of_memory", "too few steps to time")))
    return tried, began
