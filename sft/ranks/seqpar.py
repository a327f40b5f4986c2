"""Rows split over N ranks (DeepSpeed's Ulysses, set up by Accelerate and the Trainer from the ParallelismConfig
in ranks/trainer.py): the one thing the libraries leave to us, a resume in the middle of an epoch.

The Trainer resumes by handing its training loader to accelerate's skip_first_batches, which rebuilds a
DataLoader from the loader's dataset and sampler. Under sequence parallelism that loader is DeepSpeed's
UlyssesSPDataLoaderAdapter, which has neither, and the resume fails ("'UlyssesSPDataLoaderAdapter' object has
no attribute 'dataset'"; transformers 5.24, accelerate 1.15, DeepSpeed 0.19.8). So the rank program puts a
skip that knows the adapter in the Trainer's place (install); every other loader goes to accelerate's own.
"""

from __future__ import annotations

from typing import Any


def install() -> None:
    """Route the Trainer's skip_first_batches through skip_turns for the Ulysses adapter."""
    import transformers.trainer as hf
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    accelerates = hf.skip_first_batches

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, UlyssesSPDataLoaderAdapter):
            return skip_turns(dataloader, num_batches, accelerates)
        return accelerates(dataloader, num_batches)

    hf.skip_first_batches = skip_first_batches


def skip_turns(adapter: Any, num_batches: int, skip_first_batches: Any) -> Any:
    """The adapter past its first `num_batches` batches. It takes one batch from each rank's own loader and
    gives the N ranks of a group each of those N rows in turn: N of its batches are one of each rank's.
    So whole turns are skipped in the ranks' loaders (accelerate's skip), the rest of a turn by reading it."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    n = adapter.sp_world_size
    resumed = UlyssesSPDataLoaderAdapter(skip_first_batches(adapter.dl, num_batches // n), sp_rank=adapter.sp_rank,
                                         sp_group=adapter.sp_group, sp_world_size=n, device=adapter.device)
    for _ in range(num_batches % n):  # every rank of the group reads it: the refill is a collective
        next(resumed)
    return resumed
