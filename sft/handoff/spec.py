"""What the controller decided, as the ranks and a later start read it: the RunSpec of a launch and its parts."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from .records import Record

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
    # evaluate every this many steps (and at the end); None: with each checkpoint saved by time, or no evaluation
    eval_steps: int | None = None
    loss_on: str = "all"  # all, assistant, completion
    seed: int = 42  # draws the mixture and the held-out rows
    dropped: list[int] = field(default_factory=list)  # SFT_LONG_ROWS=drop: training rows left out, by position
    drop_empty: bool = False  # SFT_EMPTY_ROWS=drop: each source's rows that teach nothing left out (data/empty.py)
    processes: int = 1  # processes that tokenise and pack the rows (TRL's dataset_num_proc; data/tokens.py)
    # the training rows' tokens as the data step made them (OUTPUT/run/tokens, data/cache.py), before the drop of
    # `dropped`; "": the ranks tokenise the rows themselves
    tokens: str = ""

    @property
    def evaluates(self) -> bool:
        return bool(self.eval) or self.eval_fraction > 0


@dataclass(frozen=True)
class RunSpec(Record):
    """Everything a rank needs, decided: the ranks read nothing else of the controller's."""

    mode: str  # "probe" (times steps, saves nothing) or "train"
    model: str
    data: DataPlan
    trainer: dict[str, Any]  # SFTConfig's keyword arguments (sft/planner/arguments.py), SFT_TRAINER_ARGS's among them
    stage: str
    attention: str
    compile: bool
    report_dir: str
    stop_file: str
    final_dir: str
    record: CheckpointRecord
    resume: str | None = None
    report_to: str = "none"  # SFT_REPORT_TO: each tracker's local files go under run_dir (trackers log in training)
    run_dir: str = ""  # OUTPUT/run: rank 0 appends events.jsonl and rewrites progress.json there
    sequence_parallel: int = 1  # GPUs that share each row (DeepSpeed's Ulysses); 1: off
    head_tiles_kept_bytes: int = 0  # the LM head's logits tiles kept for its backward (planner/memory.py); 0: none
    # FlashAttention-4's kernels are compiled beside the ranks' start by a process holding this lock, which each rank
    # waits for at its first attention call (ranks/attention_ahead.py); "": none
    attention_lock: str = ""
    # A training launch that is also the probe: after this many steps (or the run's last, if sooner) every rank
    # reports as a probe (RankReport mode "probe") and waits for the controller's Verdict in verdict_file. 0: never.
    hold_at: int = 0
    verdict_file: str = ""
    save_background: bool = False  # checkpoints written while the steps go on (ranks/patches/background.py)
    snapshot_bytes: int = 0  # the host memory each rank takes ahead for them (its share of planner/disk.py's figure)
    # A checkpoint after this many seconds of training (SFT_SAVE_MINUTES), rank 0's clock deciding for every rank
    # (ranks/cadence.py); 0: by the Trainer's save_steps, or none (a probe)
    save_seconds: float = 0.0

    @property
    def evaluates_with_saves(self) -> bool:
        """Evaluation with each checkpoint saved by time and at the end (no SFT_EVAL_STEPS): the ranks' clock asks."""
        return bool(self.save_seconds) and self.data.evaluates and self.data.eval_steps is None

    @property
    def probes(self) -> bool:
        """Its first steps are the probe's: a probe, or a training launch that waits for the probe's verdict."""
        return self.mode == "probe" or self.hold_at > 0

    def sft_config(self, in_rank: bool = True):
        """TRL's SFTConfig from these arguments, the objects among them made here; `in_rank=False` (`entrypoint.py
        config`): outside the ranks there is no process state of theirs to use."""
        from trl import SFTConfig

        args = dict(self.trainer)
        args["parallelism_config"] = parallelism(args["parallelism_config"])
        if not in_rank:
            args["accelerator_config"] = {**args["accelerator_config"], "use_configured_state": False}
        return SFTConfig(**args)

    # What the processes read of the Trainer's arguments besides the Trainer, each named once here.
    @property
    def micro_batch(self) -> int:
        return self.trainer["per_device_train_batch_size"]

    @property
    def grad_accum(self) -> int:
        return self.trainer["gradient_accumulation_steps"]

    @property
    def max_length(self) -> int:
        return self.trainer["max_length"]

    @property
    def max_steps(self) -> int:
        return self.trainer["max_steps"]

    @property
    def packing(self) -> bool:
        return self.trainer["packing"]

    @property
    def bf16(self) -> bool:
        return self.trainer["bf16"]

    @property
    def node_timeout_seconds(self) -> int:
        return self.trainer["ddp_timeout"]

    @property
    def model_revision(self) -> str | None:
        return self.trainer["model_init_kwargs"]["revision"]

    @property
    def trust_remote_code(self) -> bool:
        return bool(self.trainer.get("trust_remote_code"))


def parallelism(asked: dict[str, Any] | None):
    """Accelerate's ParallelismConfig for DeepSpeed's Ulysses, as the Trainer's arguments describe it (None: off)."""
    if asked is None:
        return None
    from accelerate.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig

    return ParallelismConfig(sp_backend=asked["sp_backend"], sp_size=asked["sp_size"],
                             dp_replicate_size=asked["dp_replicate_size"],
                             sp_handler=DeepSpeedSequenceParallelConfig(
                                 sp_attn_implementation=asked["sp_attn_implementation"]))
