"""Rows split over N ranks (DeepSpeed's Ulysses, set up by Accelerate and the Trainer from the ParallelismConfig
in planner/arguments.py): how the Trainer reads DeepSpeed's batch adapter, where the libraries leave two gaps
(transformers 5.24, accelerate 1.15, DeepSpeed 0.19.8; tests/test_seqpar.py shows both):

- Epochs. The Trainer starts each epoch with iter() and set_epoch() on its loader. UlyssesSPDataLoaderAdapter
  has no set_epoch and returns itself from iter(), still at the end of the last epoch, so the first batch of
  every epoch after the first comes back empty: one step fewer per epoch.
- A resume in the middle of an epoch. The Trainer hands its loader to accelerate's skip_first_batches, which
  rebuilds a DataLoader from the loader's dataset and sampler; the adapter has neither ("no attribute
  'dataset'").

So the rank program wraps the adapter the Trainer makes in Turns, which reads each epoch anew in that epoch's
order, and puts a skip that knows Turns in the Trainer's place (install); every other loader goes to
accelerate's own skip.
"""

from __future__ import annotations

from typing import Any


class Turns:
    """DeepSpeed's adapter, read as the Trainer reads a DataLoader. The adapter takes one batch from each rank's
    own loader and gives the N ranks of a group each of those N rows in turn: N of its batches are one turn."""

    def __init__(self, adapter: Any, pending: int = 0):
        self.adapter = adapter
        self.pending = pending  # batches of a turn already trained before a resume: read and dropped

    def __len__(self) -> int:
        return len(self.adapter)

    def set_epoch(self, epoch: int) -> None:
        """What the Trainer does to a DataLoader, done to the ranks' own loader inside the adapter."""
        loader = self.adapter.dl
        loader.set_epoch(epoch)
        inner = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
        if hasattr(inner, "set_epoch"):
            inner.set_epoch(epoch)

    def __iter__(self) -> Turns:
        self.adapter.iter = iter(self.adapter.dl)  # the epoch from its first batch, in its epoch's order
        self.adapter.micro_batches.clear()
        return self

    def __next__(self) -> Any:
        while self.pending:  # every rank of the group reads them: the adapter's refill is a collective
            self.pending -= 1
            next(self.adapter)
        return next(self.adapter)


def install(trainer: Any) -> None:
    """Turns around the adapter the Trainer makes, and the Trainer's skip_first_batches through skip_turns."""
    import transformers.trainer as hf

    make = trainer.accelerator.deepspeed_ulysses_dl_adapter
    trainer.accelerator.deepspeed_ulysses_dl_adapter = lambda dl, model: Turns(make(dl, model))
    accelerates = hf.skip_first_batches
    if getattr(accelerates, "knows_turns", False):
        return

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, Turns):
            return skip_turns(dataloader, num_batches, accelerates)
        return accelerates(dataloader, num_batches)

    skip_first_batches.knows_turns = True  # type: ignore[attr-defined]
    hf.skip_first_batches = skip_first_batches


def skip_turns(turns: Turns, num_batches: int, skip_first_batches: Any) -> Turns:
    """Turns past its first `num_batches` batches: whole turns skipped in the ranks' own loaders (accelerate's
    skip), the rest of a turn read and dropped."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    a = turns.adapter
    n = a.sp_world_size
    skipped = skip_first_batches(a.dl, num_batches // n)
    return Turns(UlyssesSPDataLoaderAdapter(skipped, sp_rank=a.sp_rank, sp_group=a.sp_group, sp_world_size=n,
                                            device=a.device), pending=num_batches % n)
