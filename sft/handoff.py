"""What crosses a process or a restart, typed: each a dataclass with one JSON round trip.

    RunSpec           controller -> every rank: what to train and where (run/spec-MODE.json)
    RankReport        each rank -> controller: how it ended, its steps and memory (run/reports/)
    Verdict           controller -> every rank of a training launch that probes: go on, or end (run/verdict.json)
    Start             controller -> the processes started before its decision: the spec they run
                      (in a StandbyFolder: controller/standby.py)
    CheckpointRecord  rank 0 -> a later start: how a checkpoint was made (checkpoint-N/sft_job.json)
    Summary           controller -> the user, the Hub and a later start (run/summary.json)

Unknown keys in a file are ignored when it is read (a newer job's file stays readable by an older one),
and a missing key takes the field's default.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def write_json(path: Path, data: Any) -> Path:
    """Write atomically (a reader, or a VM that dies mid-write, never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_json(path: Path) -> Any:
    """The JSON in a file; None when it is missing, unreadable or half-written."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


class Record:
    """The JSON round trip every hand-off shares: to_dict, from_dict, save, load."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value, kind = data[f.name], hints[f.name]
            nested = _record_type(kind)
            if nested and isinstance(value, dict):
                value = nested.from_dict(value)
            elif nested and isinstance(value, list):  # list[SomeRecord]
                value = [nested.from_dict(v) if isinstance(v, dict) else v for v in value]
            values[f.name] = value
        return cls(**values)

    def save(self, path: Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls: type[T], path: Path) -> T | None:
        """The record in `path`, or None when there is none (missing, torn or not a JSON object)."""
        data = read_json(path)
        return cls.from_dict(data) if isinstance(data, dict) else None  # type: ignore[attr-defined]


def _record_type(kind: Any) -> type | None:
    """The Record class in a field's type: X, X | None, list[X] (None: no Record in it)."""
    for t in typing.get_args(kind) or (kind,):
        if isinstance(t, type) and issubclass(t, Record):
            return t
        if typing.get_origin(t) is list:
            return _record_type(t)
    return None


@dataclass(frozen=True)
class Split(Record):
    """How the rows of one optimizer step are split: micro-batch x accumulation, and checkpointing."""

    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    offload_activations: bool = False  # the checkpoints kept in host memory, not on the GPU (long rows)

    @property
    def rows(self) -> int:
        return self.micro_batch * self.grad_accum

    @property
    def checkpointing_text(self) -> str:
        return "offload" if self.offload_activations else "on" if self.gradient_checkpointing else "off"

    def text(self) -> str:
        """As the log names it: '4 x 1, checkpointing off'."""
        return f"{self.micro_batch} x {self.grad_accum}, checkpointing {self.checkpointing_text}"


@dataclass(frozen=True)
class CheckpointRecord(Record):
    """Written into every checkpoint before the Trainer saves there: a resume must match it."""

    stage: str
    world_size: int
    batch: Split | None = None  # set when a batch search chose the split: a resume keeps it
    tokens: int | None = None  # tokens trained on up to this checkpoint (TRL's count, all ranks): a resume counts on
    max_steps: int | None = None  # set when the budget capped the run's steps: a resume stops there too
    sequence_parallel: int = 1  # GPUs sharing each row: it sets the rows each step reads, so a resume keeps it

    FILE: typing.ClassVar[str] = "sft_job.json"


@dataclass(frozen=True)
class DataSource(Record):
    """One source of rows, as the ranks load it: a local file or folder, a save_to_disk folder, a Hub dataset."""

    path: str  # as written in SFT_DATASET / SFT_EVAL_DATASET: a local path or a Hub name
    split: str = "train"
    config: str | None = None  # a Hub dataset's configuration (SFT_DATASET_CONFIG)
    revision: str | None = None  # a Hub dataset's commit, resolved at start; None: local, or unresolved offline
    rows: int | None = None  # draw this many rows (seeded; more than it holds repeats rows)
    weight: float | None = None  # or scale its rows by this

    def text(self) -> str:
        """As the log names it: 'org/name (config x, split test, @abc1234), 200 rows'."""
        extra = [f"config {self.config}" if self.config else "", f"split {self.split}" if self.split != "train"
                 else "", f"@{self.revision[:12]}" if self.revision else ""]
        inside = ", ".join(e for e in extra if e)
        amount = f" x{self.weight:g}" if self.weight is not None else f", {self.rows} rows" if self.rows else ""
        return self.path + (f" ({inside})" if inside else "") + amount


@dataclass(frozen=True)
class DataPlan(Record):
    """What the ranks train and evaluate on, and which tokens carry the loss (decided by planner/data.py)."""

    train: list[DataSource]
    eval: list[DataSource] = field(default_factory=list)  # SFT_EVAL_DATASET, or SFT_DATASET's eval split
    eval_fraction: float = 0.0  # rows held out of the training rows instead (seeded: the same on every start)
    eval_steps: int | None = None  # evaluate every this many steps (and at the end); None: no evaluation
    loss_on: str = "all"  # all, assistant, completion
    seed: int = 42  # draws the mixture and the held-out rows
    dropped: list[int] = field(default_factory=list)  # SFT_LONG_ROWS=drop: training rows left out, by position
    processes: int = 1  # processes that tokenise and pack the rows (TRL's dataset_num_proc; data/tokens.py)

    @property
    def evaluates(self) -> bool:
        return bool(self.eval) or self.eval_fraction > 0


@dataclass(frozen=True)
class RunSpec(Record):
    """Everything a rank needs, decided: the ranks read nothing else of the controller's."""

    mode: str  # "probe" (times steps, saves nothing) or "train"
    model: str
    data: DataPlan
    max_length: int
    packing: bool
    epochs: float
    max_steps: int
    learning_rate: float
    save_steps: int
    save_total_limit: int
    logging_steps: int
    seed: int
    bf16: bool
    attention: str
    liger_kernels: bool
    compile: bool
    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    offload_activations: bool  # the checkpoints in host memory (TRL's activation_offloading)
    trainer_args: dict[str, Any]  # SFT_TRAINER_ARGS, checked against the arguments the job sets
    node_timeout_seconds: int
    stage: str
    ds_config: str  # the DeepSpeed JSON's path
    output_dir: str  # the Trainer's: checkpoints go here
    report_dir: str
    stop_file: str
    final_dir: str
    record: CheckpointRecord
    resume: str | None = None
    report_to: str = "none"  # SFT_REPORT_TO (trackers log in training only, never in a probe)
    run_name: str | None = None
    run_dir: str = ""  # OUTPUT/run: rank 0 appends events.jsonl and rewrites progress.json there
    model_revision: str | None = None  # the model's commit, resolved at start (None: a local folder)
    chat_template: str | None = None  # SFT_CHAT_TEMPLATE: TRL's chat_template_path
    sequence_parallel: int = 1  # GPUs that share each row (DeepSpeed's Ulysses); 1: off
    head_tiles_kept_bytes: int = 0  # the LM head's logits tiles kept for its backward (planner/memory.py); 0: none
    # FlashAttention-4's kernels are compiled beside the ranks' start by a process holding this lock, which each rank
    # waits for at its first attention call (ranks/attention_ahead.py); "": none
    attention_lock: str = ""
    # A training launch that is also the probe: after this many steps (or the run's last, if sooner) every rank
    # reports as a probe (RankReport mode "probe") and waits for the controller's Verdict in verdict_file. 0: never.
    hold_at: int = 0
    verdict_file: str = ""

    @property
    def probes(self) -> bool:
        """Its first steps are the probe's: a probe, or a training launch that waits for the probe's verdict."""
        return self.mode == "probe" or self.hold_at > 0


@dataclass(frozen=True)
class Verdict(Record):
    """The controller's word to a training launch waiting after the probe's steps: go on as the training, or end
    there (an escalation, the budget's cap or refusal, a stop: the job relaunches or closes)."""

    go_on: bool
    why: str = ""


@dataclass(frozen=True)
class Start(Record):
    """The controller's word to a process it started before deciding (sft/ranks/standby.py): the RunSpec it runs."""

    spec: str  # the RunSpec's path


def lock_held(path: Path | str) -> bool:
    """Whether a live process holds `path` locked (flock, exclusively): the kernel frees a dead holder's lock.
    False where the file is missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it a shared lock taken just now


@dataclass(frozen=True)
class StandbyFolder:
    """The standby's private folder (controller/standby.py), as the controller and its processes share it."""

    path: Path

    @property
    def ranks(self) -> Path:  # the ranks' Start
        return self.path / "ranks.json"

    @property
    def controller(self) -> Path:  # locked by the controller while it lives (`waits`)
        return self.path / "controller.lock"

    def waits(self) -> bool:
        """Whether the controller that made this folder still lives, and has not ended its standby (the folder
        removed, or the lock free: the controller died without a word)."""
        return lock_held(self.controller)

    @property
    def ahead(self) -> Path:  # FlashAttention-4's process's Start
        return self.path / "ahead.json"

    @property
    def lock(self) -> Path:  # that process's lock (RunSpec.attention_lock)
        return self.path / "attention-kernels.lock"

    @property
    def cache(self) -> Path:  # a link, through which the processes find the compiled kernels (their environment)
        return self.path / "compile-cache"

    @property
    def cache_before_start(self) -> Path:  # where the link points until the Start: not yet the output folder
        return self.path / "compile-cache-before-start"


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
