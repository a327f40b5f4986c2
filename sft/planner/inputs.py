"""What the decision is a function of: the settings, the machine, the model's shape, a checkpoint's record;
and the ranks it runs on. Measured and read by the controller (controller/machine.py, controller/inputs.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..handoff import CheckpointRecord, DataSource
from ..settings import Settings
from .shape import ModelShape

if TYPE_CHECKING:
    from .plan import Plan


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    capability: tuple[int, int] = (9, 0)  # CUDA compute capability (Hopper: 9.0)


@dataclass(frozen=True)
class Machine:
    """The machine as the decision needs it; controller/machine.py measures it."""

    gpus: tuple[GPU, ...] = ()  # every GPU this process sees
    host_memory_bytes: int | None = None  # available RAM (the container's limit, if lower)
    memlock_bytes: int | None = None  # soft `ulimit -l`; None: unlimited
    liger_installed: bool = False  # liger-kernel and Triton importable
    flash_attention_4_installed: bool = False  # flash-attn-4 and the CuTe DSL installed
    flash_attention_4_broken: str = ""  # installed, but importing it failed: the error
    nodes: int = 1


@dataclass(frozen=True)
class DataFacts:
    """The data as the controller read and checked it (controller/data.py)."""

    shape: str  # TRL's name for its type, e.g. "conversational prompt-completion"
    conversational: bool
    prompt_completion: bool
    train: tuple[DataSource, ...]  # Hub sources with their commits resolved
    eval: tuple[DataSource, ...] = ()  # SFT_EVAL_DATASET's, or SFT_DATASET's at SFT_EVAL_SPLIT
    rows: int = 0  # training rows, as drawn (before any are held out)
    eval_rows: int = 0
    marks_assistant: bool | None = None  # the chat template can mark the assistant's tokens (None: not asked)
    dropped: tuple[int, ...] = ()  # SFT_LONG_ROWS=drop: the positions of the training rows left out


@dataclass(frozen=True)
class Inputs:
    """What the decision is a function of."""

    settings: Settings
    machine: Machine
    shape: ModelShape
    ranks: Ranks  # chosen once, before the data is read (rules.choose_ranks)
    record: CheckpointRecord | None = None  # of the checkpoint this start resumes from
    user_config: Mapping[str, Any] | None = None  # SFT_DS_CONFIG's contents
    data: DataFacts | None = None  # None where only the model and machine matter (`plan`)
    model_revision: str | None = None  # the model's commit (None: a local folder, or not resolved)
    remote_code: tuple[str, ...] = ()  # the classes the model maps to its own code ("AutoConfig -> x.Y")


@dataclass(frozen=True)
class Ranks:
    """How many ranks run, and on which devices."""

    count: int  # on this node
    gpus: tuple[int, ...]  # empty: CPU ranks on gloo
    nodes: int = 1  # every node runs as many ranks (the nodes check it at start)
    why: str = field(default="", compare=False)  # the rule's reason (rules.choose_ranks)

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def world(self) -> int:
        """Ranks of the whole job: what ZeRO shards over and what a checkpoint records."""
        return self.count * self.nodes


class CannotRun(Exception):
    """No decision can run this job here; the message says why and what to change."""

    def __init__(self, message: str, exit_code: int, plan: Plan | None = None):
        super().__init__(message)
        self.exit_code, self.plan = exit_code, plan  # plan: when nothing fits, every option's prediction
