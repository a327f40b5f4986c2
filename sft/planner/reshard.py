"""A resume on another number of ranks: which split of each rank's rows keeps the checkpoint's global batch.

ZeRO shards the optimizer state over the ranks that wrote a checkpoint, so DeepSpeed cannot load it into
another number of ranks. Its universal checkpoint can: the controller converts the checkpoint with
DeepSpeed's ds_to_universal (controller/reshard.py) and the engine loads it with
"checkpoint": {"load_universal": true}, which the decision sets for this start only (later checkpoints
are ordinary ones, written by the new ranks).

What stays the same is the global batch, the rows of one optimizer step: ranks x micro-batch x
accumulation. The Trainer draws every row from one seeded permutation (accelerate's SeedableRandomSampler,
seeded with SFT_SEED and the epoch, whatever the number of ranks) cut into micro-batches dealt round the
ranks, so with the same rows per step each step trains on the same rows, the steps per epoch
(ceil(rows / rows per step)) and with them the learning-rate schedule stay, and the rows a resume skips
(steps done x accumulation micro-batches per rank) are the rows trained on. With each row split over N
GPUs (SFT_SEQUENCE_PARALLEL, which a resume keeps) the rows of a step are those of the world / N
data-parallel groups, each group's N GPUs sharing its micro-batches, so the groups are what is counted.
Pure: no file is read here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import exitcodes, stages
from ..handoff import CheckpointRecord, Record, Split
from ..stages import Stage
from .inputs import CannotRun

if TYPE_CHECKING:
    from .plan import Row


@dataclass(frozen=True)
class Reshard(Record):
    """From the ranks that wrote the checkpoint to this start's, with each rank's split before and after."""

    from_world: int
    to_world: int
    before: Split
    after: Split
    sequence_parallel: int = 1  # GPUs sharing each row, before and after: world / N data-parallel groups

    @property
    def rows(self) -> int:
        """The global batch: rows per optimizer step over every data-parallel group (the same before and after)."""
        return self.from_world // self.sequence_parallel * self.before.rows

    def text(self) -> str:
        return (f"convert from {self.from_world} to {ranks(self.to_world)}, accumulation {self.before.grad_accum} -> "
                f"{self.after.grad_accum}" + (f", micro-batch {self.before.micro_batch} -> {self.after.micro_batch}"
                                              if self.after.micro_batch != self.before.micro_batch else ""))


def plan(record: CheckpointRecord, world: int, split: Split, seq: int = 1) -> tuple[Reshard, str]:
    """(the change, why) for a checkpoint of record.world_size ranks resumed on `world`, each row split over
    `seq` of them (the checkpoint's); `split` is each rank's split when it was written (the record's, else the
    settings'). Raises CannotRun when `world` cannot share its global batch evenly: another global batch
    would be another training, and the Trainer's skip of the rows already trained (counted in this start's
    micro-batches) would land elsewhere in the data."""
    if record.stage in stages.NAMES and stages.get(record.stage).eight_bit:
        raise CannotRun(
            f"the checkpoint to resume was written by {ranks(record.world_size)} with 8-bit AdamW state "
            f"({stages.get(record.stage).label}): bitsandbytes quantises each rank's slice in blocks of 256, which "
            "DeepSpeed's universal checkpoint (fp32 moments by name) cannot convert to another number of ranks. "
            f"Resume on {ranks(record.world_size)} (SFT_GPUS), or start a new run", exitcodes.PREFLIGHT)
    groups_before, groups_after = record.world_size // seq, world // seq
    rows = groups_before * split.rows
    before = f"{groups(record.world_size, seq)} x {split.micro_batch} x {split.grad_accum}"
    if rows % groups_after:
        fits = ", ".join(str(n * seq) for n in range(1, rows + 1) if rows % n == 0)
        raise CannotRun(
            f"the checkpoint to resume was trained with {rows} rows per optimizer step ({before}: "
            f"{'ranks' if seq == 1 else 'data-parallel groups'} x micro-batch x accumulation), which "
            f"{groups(world, seq)} cannot share evenly; another global batch would change the training and where "
            f"in the data it goes on. Start on a number of ranks that {_divides(rows, seq)} ({fits}; SFT_GPUS), "
            "or start a new run", exitcodes.PREFLIGHT)
    per_rank = rows // groups_after
    # the checkpoint's micro-batch where it divides this rank's rows (its memory is known to fit), else the
    # largest one below it that does
    micro = max(m for m in range(1, min(split.micro_batch, per_rank) + 1) if per_rank % m == 0)
    after = dataclasses.replace(split, micro_batch=micro, grad_accum=per_rank // micro)
    change = Reshard(record.world_size, world, split, after, seq)
    return change, (f"{change.text()}: the checkpoint was written by {before}; {groups(world, seq)} x {micro} x "
                    f"{after.grad_accum} keep its {rows} rows per step, so the learning-rate schedule and the "
                    "data order go on where they were; its ZeRO shards are converted to DeepSpeed's universal "
                    "checkpoint, which loads on any number of ranks")


def with_fit(why: str, row: Row, stage: Stage) -> str:
    """The reason, warned where the plan predicts the checkpoint's stage does not fit the new ranks (fewer ranks
    hold more of it each). A resume runs no probe, so training would be the first to run out of memory."""
    if row.fits:
        return why
    return (f"{why}; warning: the plan predicts {stage.label} is {row.why} on these ranks, so training may run out "
            "of memory (exit 6): start on more GPUs")


def ranks(n: int) -> str:
    return f"{n} rank" + ("" if n == 1 else "s")


def groups(world: int, seq: int = 1) -> str:
    """'4 ranks', or with rows split over 2 of them, '2 data-parallel groups of 2 ranks'."""
    if seq == 1:
        return ranks(world)
    n = world // seq
    return f"{n} data-parallel group{'' if n == 1 else 's'} of {ranks(seq)}"


def _divides(rows: int, seq: int) -> str:
    return f"divides {rows}" if seq == 1 else f"is {seq} (the checkpoint's SFT_SEQUENCE_PARALLEL) x a divisor of {rows}"


def universal_load(config: Mapping[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config that loads a universal checkpoint (what the engine reads to resume: latest_universal
    instead of latest, and each parameter's state from zero/NAME/ instead of the ranks' shards)."""
    return {**config, "checkpoint": {**dict(config.get("checkpoint") or {}), "load_universal": True}}
