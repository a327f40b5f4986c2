"""run/summary.json: the run as it ended. Each of the job's steps hands back a typed part (Parts); the summary is
built from them at the end (`build`), in the shape status.py, the model card and a later start read back."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..console import say
from ..handoff import RankReport, Record, Summary
from ..planner.budget import BudgetCall
from ..planner.deadline import Deadline
from ..planner.decision import Decision
from ..planner.plan import Plan
from ..settings import Settings
from ..units import gib
from . import data, figures
from .output import Paths, eval_results, losses, plot_loss
from .preflight import Check
from .probe import Outcome


@dataclass
class TrainResult(Record):
    """The training's figures, from the ranks' reports (rank 0 holds the step times)."""

    wall_seconds: float
    peak_reserved_gib: list[float]
    status: str | None = None  # rank 0's: done, stopped, oom, failed (None: it wrote no report)
    global_step: int | None = None
    train_runtime: float | None = None
    train_loss: float | None = None
    num_tokens: int | None = None
    tokens_before: int = 0
    stop_reason: str | None = None  # why the ranks stopped themselves (the disk would fill)
    error: str | None = None
    log_history: list[dict[str, Any]] = field(default_factory=list)
    eval_seconds: float = 0.0
    tokens_per_second: float | None = None  # this start's tokens in this start's time
    steady_tokens_per_second: float | None = None
    went_on_from_probe_step: int | None = None  # the training's launch was the probe's, from this step

    OPTIONAL = ("tokens_per_second", "steady_tokens_per_second", "went_on_from_probe_step")  # absent when unknown

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_dict().items() if v is not None or k not in self.OPTIONAL}

    @classmethod
    def of(cls, reports: list[RankReport], wall: float, went_on_from: int | None = None) -> TrainResult:
        result = cls(round(wall, 1), [gib(r.peak_reserved_bytes) for r in reports],
                     went_on_from_probe_step=went_on_from)
        main = next((r for r in reports if r.rank == 0), None)
        if main is None:
            return result
        result.status, result.global_step, result.train_runtime = main.status, main.global_step, main.train_runtime
        result.train_loss, result.num_tokens = main.train_loss, main.num_tokens
        result.tokens_before = main.tokens_before
        result.stop_reason, result.error, result.log_history = main.stop_reason, main.error, main.log_history
        result.eval_seconds = round(main.eval_seconds, 3)
        if main.num_tokens and main.train_runtime:
            result.tokens_per_second = round((main.num_tokens - main.tokens_before) / main.train_runtime, 1)
        if rates := figures.steady_rates(main.steps):
            result.steady_tokens_per_second = rates["tokens_per_second"]
        return result


class Phases:
    """Where the time went: the seconds from the end of one of the job's steps to the end of the next."""

    def __init__(self, started_at: float):
        self.seconds: dict[str, float] = {}
        self._began = started_at

    def done(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(now - self._began, 1)
        self._began = now


@dataclass
class Parts:
    """What the job's steps handed back so far: each part is set by the step that makes it."""

    settings: Settings
    nodes: int
    started_at: float
    phases: Phases
    time_limit: Deadline | None = None
    resumed_from: Path | None = None
    found: data.Found | None = None  # the data as read and checked
    decision: Decision | None = None  # as it stands: the probe, the budget may change it
    plan: Plan | None = None  # the plan the start decided on
    preflight: list[Check] = field(default_factory=list)
    probe: Outcome | None = None
    budget: BudgetCall | None = None
    reshard: dict[str, Any] | None = None  # what was converted for another number of ranks (reshard.py)
    train: TrainResult | None = None
    probe_check: dict[str, Any] | None = None  # the probe as a predictor of the run (figures.against_run)
    hub: dict[str, Any] | None = None  # what reached the Hub (the uploader's account)


def build(parts: Parts, code: int, status: str) -> Summary:
    """The summary of this start, from its parts."""
    d, outcome, train = parts.decision, parts.probe, parts.train
    history = train.log_history if train else []
    budget = parts.budget if parts.budget is not None and parts.budget.verdict != "none" else None
    return Summary(
        status=status, exit_code=code, settings=parts.settings.to_dict(), nodes=parts.nodes,
        ranks=d.ranks.world if d else None, stage=d.stage.name if d else None,
        resolved=d.resolved() if d else None, decisions=dict(d.reasons) if d else {},
        plan=parts.plan.to_dict() if parts.plan else None,
        preflight=[{"name": c.name, "status": c.status, "message": c.message} for c in parts.preflight],
        resumed_from=str(parts.resumed_from) if parts.resumed_from else None, reshard=parts.reshard,
        batch_search=outcome.batch_search if outcome else None, escalations=outcome.escalations if outcome else [],
        probe=outcome.figures if outcome else None, train=train.to_dict() if train else None,
        probe_check=parts.probe_check,
        started_at=parts.started_at, phases=dict(parts.phases.seconds),
        final_loss=points[-1][1] if (points := losses(history)) else None, hub=parts.hub,
        budget={"verdict": budget.verdict, "reason": budget.reason, "max_steps": budget.max_steps,
                "fits": list(budget.fits)} if budget else None,
        time_limit={"at": parts.time_limit.text(), "source": parts.time_limit.source} if parts.time_limit else None,
        data=data.summary(parts.found, d.data if d else None), model_revision=d.model_revision if d else None,
        eval=eval_results(history))


def write(summary: Summary, paths: Paths, model: str | None = None) -> None:
    """The summary, then with the model's name the loss plot; on a full disk the exit code and the log still come
    out, naming what was not written. The summary first: it is the run's record, the plot only a picture of it, and
    a plot that fails otherwise (its library, its figure) is said and fails nothing."""
    history = (summary.train or {}).get("log_history") or []
    try:
        summary.save(paths.summary)
        if model is not None and (points := losses(history)):
            plot_loss(points, paths.run / "loss.png", f"{model} (ZeRO {summary.stage})", losses(history, "eval_loss"))
    except OSError as e:
        say(f"error: could not write {paths.summary} or the loss plot ({e.strerror or e}): this log is the only "
            "record of this start")
    except Exception as e:  # noqa: BLE001 - the plot's own failure: the summary is written, the run's end goes on
        say(f"warning: no loss plot ({type(e).__name__}: {e}); the losses are in {paths.summary}")
