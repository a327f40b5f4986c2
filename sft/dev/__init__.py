"""A developer's tools in the ranks, which the job itself never imports: the rank program loads this package by
name only when an SFTDEV_ or SFTTEST_ variable is set (sft/ranks/devtools.py; tests/test_architecture.py keeps every
import of it out of the job's code).

    faults.py     the tests' faults: an out-of-memory in the probe, a disk another writer fills before a save,
                  slower steps, each token's loss recorded (SFTTEST_*)
    profiling.py  one steady step under torch's profiler (SFTDEV_PROFILE_STEP), the allocator's history
                  (SFTDEV_MEMORY_SNAPSHOT); timeline.py reads the traces it writes
"""

from __future__ import annotations

from ..handoff import RunSpec
from . import faults, profiling


def before_training(spec: RunSpec) -> None:
    """Just before the Trainer's loop (raises the faults a test asked for)."""
    faults.inject(spec)
    faults.slow_writes()


def callbacks_first() -> list:
    """Callbacks ahead of the rank's own: what they do counts in the step times."""
    return faults.slow_steps()


def callbacks_last(spec: RunSpec) -> list:
    """Callbacks after the rank's own: they see the save and the stop the rank's callback asked for."""
    return [c for c in (*faults.full_disk(), profiling.callback(spec.report_dir),
                        profiling.memory_callback(spec.report_dir)) if c is not None]


def with_trainer(trainer, spec: RunSpec) -> None:
    """Once the Trainer is made: what observes its model."""
    faults.record_token_losses(trainer.model, spec)
