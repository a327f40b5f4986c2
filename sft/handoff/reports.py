"""What comes back: each rank's report of a run, and the job's summary of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import Record

@dataclass
class RankReport(Record):
    """One rank's account of a run, written when it ends, however it ends."""

    mode: str
    status: str = "started"  # done, stopped, oom, failed; ended: the controller's Verdict ended it after the probe
    rank: int = 0
    world_size: int = 1
    error: str | None = None
    steps: list[list[float]] = field(default_factory=list)  # [step, perf_counter seconds, tokens so far]
    train_began: float | None = None  # perf_counter when the Trainer began its loop (the first step's start)
    first_step_wall: float | None = None  # time.time() when the first step ended: start-up as users wait it
    train_began_wall: float | None = None  # time.time() at train_began: the ranks' start before any step
    steps_per_epoch: int | None = None
    conversations: int | None = None
    global_step: int | None = None
    train_runtime: float | None = None
    train_loss: float | None = None
    num_tokens: int | None = None  # since the run began, resumes included
    tokens_before: int = 0  # of those, the tokens of the starts before this one (a resume's checkpoint record)
    stop_reason: str | None = None  # why the ranks stopped themselves (the disk would fill), when they did
    log_history: list[dict[str, Any]] = field(default_factory=list)
    stopped: bool = False
    device: str | None = None
    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int | None = None
    total_bytes: int | None = None  # the GPU's memory (None on CPU)
    alloc_retries: int | None = None  # the caching allocator flushed its cache this often (GPU only)
    eval_rows: int | None = None  # rows of the evaluation set, as prepared (packed rows when packing)
    eval_batches: int | None = None  # batches of one evaluation pass on this rank
    eval_seconds_per_batch: float | None = None  # measured by the probe on a few batches
    eval_seconds: float = 0.0  # spent evaluating during training (left out of the step times)
    held_seconds: float = 0.0  # spent after the probe's steps waiting for the Verdict (left out of them too)
    # time.time() at each point of the rank's end: trained (train() returned, its last write waited for), final
    # (final/ made), written (the retired checkpoints' removal done), reported (this report written): where the end goes
    ended_wall: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def path(report_dir: Path, mode: str, rank: int) -> Path:
        return Path(report_dir) / f"{mode}-rank{rank}.json"


@dataclass
class Summary(Record):
    """The run as it ended: what was asked, decided, measured and saved (run/summary.json)."""

    status: str = "started"  # done, stopped, failed, probed, probe failed, preflight failed
    exit_code: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    nodes: int = 1
    ranks: int | None = None
    stage: str | None = None
    resolved: dict[str, Any] | None = None  # the decision: every "auto" made concrete
    decisions: dict[str, str] = field(default_factory=dict)  # why each choice was made
    plan: dict[str, Any] | None = None
    preflight: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: str | None = None
    reshard: dict[str, Any] | None = None  # the checkpoint converted for another number of ranks (from, to, splits)
    batch_search: dict[str, Any] | None = None
    escalations: list[dict[str, str]] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    train: dict[str, Any] | None = None
    probe_check: dict[str, Any] | None = None
    started_at: float | None = None  # time.time() when this start of the job began
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent in each step of the job
    final_loss: float | None = None
    hub: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None  # the budget gate's call: verdict, reason, max_steps, what would fit
    time_limit: dict[str, Any] | None = None  # the deadline and what set it
    data: dict[str, Any] | None = None  # what it trained and evaluated on: shape, sources and commits, rows
    model_revision: str | None = None  # the model's commit (None: a local folder)
    eval: dict[str, Any] | None = None  # the last evaluation: loss and token accuracy, at which step
