"""The decision: every choice of one start, and why (decide.py makes it; the controller carries it out)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..handoff import CheckpointRecord, DataPlan, Split
from ..stages import Stage
from ..units import GIB
from .inputs import Ranks
from .plan import Plan, Row
from .reshard import Reshard


@dataclass(frozen=True)
class Decision:
    """Every choice of one start, and why (reasons: one line per choice, keyed as the fields)."""

    ranks: Ranks
    bf16: bool
    attention: str
    liger: bool
    compile: bool
    stage: Stage
    ds_config: Mapping[str, Any]  # the DeepSpeed config the Trainer gets ("auto" left for it to fill)
    split: Split
    searched: bool  # the split is a batch search's (this start's or the checkpoint's): checkpoints record it
    search: tuple[Split, ...]  # the splits the batch search times before the probe (empty: none)
    pin_memory: bool
    launcher: str
    plan: Plan  # the shipped options at this split: what auto chooses among
    row: Row  # this stage's prediction under ds_config
    sequence_parallel: int = 1  # GPUs of a node that share each row (DeepSpeed's Ulysses)
    reasons: Mapping[str, str] = field(default_factory=dict)
    max_steps: int | None = None  # the budget's cap on optimizer steps; None: SFT_MAX_STEPS and SFT_EPOCHS
    reshard: Reshard | None = None  # the checkpoint resumed was written by another number of ranks
    data: DataPlan | None = None  # what the ranks train and evaluate on (None: the data was not read)
    model_revision: str | None = None  # the model's commit, as resolved at start
    probe_goes_on: bool = False  # the probe is the training's launch, which goes on after its steps (rules.py)
    save_background: bool = False  # checkpoints written while the steps go on (ranks/patches/background.py)
    snapshot_bytes: int = 0  # the host memory a node keeps for that (planner/disk.py)

    @property
    def offload(self) -> bool:
        return self.stage.offload

    def record(self) -> CheckpointRecord:
        """What every checkpoint of this decision says about how it was made."""
        # a split changed for another number of ranks is kept by later resumes, as a batch search's is
        kept = self.searched or self.reshard is not None
        return CheckpointRecord(self.stage.name, self.ranks.world, batch=self.split if kept else None,
                                max_steps=self.max_steps, sequence_parallel=self.sequence_parallel)

    def resolved(self) -> dict[str, Any]:
        """The choices as plain values, for the summary and `config`."""
        return {"ranks": self.ranks.world, "gpus": list(self.ranks.gpus), "precision": "bf16" if self.bf16 else
                "fp32", "attention": self.attention, "liger_kernels": self.liger, "compile": self.compile,
                "stage": self.stage.name, "offload": self.offload, "micro_batch": self.split.micro_batch,
                "grad_accum": self.split.grad_accum,
                "gradient_checkpointing": self.split.gradient_checkpointing, "batch_searched": self.searched,
                "pin_memory": self.pin_memory, "launcher": self.launcher, "save_background": self.save_background,
                "sequence_parallel": self.sequence_parallel,
                "predicted_peak_gib": round(self.row.peak / GIB, 2), "model_revision": self.model_revision,
                **({"loss_on": self.data.loss_on, "eval_steps": self.data.eval_steps} if self.data else {})}

    def explain(self) -> str:
        return "\n".join(f"  {name}: {why}" for name, why in self.reasons.items())
