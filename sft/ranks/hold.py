"""In every rank of a training launch that is also the probe (RunSpec.hold_at): after the probe's steps, report
as a probe and wait for the controller's Verdict, so that a probe whose figures leave the decision as it was
goes on as the training instead of being thrown away and launched again (model load, compilation, its steps).

Called by ProgressCallback at the end of the step the probe ends on, before the step's stop check. Each rank
reads the verdict file itself (the launch holds only where every rank shares node 0's disk:
planner/rules.py::probe_goes_on), and the ranks agree on what they read before they leave.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from ..handoff import RankReport, RunSpec, Verdict
from . import evaluation

POLL_SECONDS = 0.2


class Hold:
    def __init__(self, spec: RunSpec, report: RankReport, stamp: Callable[[RankReport], None],
                 stop_asked: Callable[[], bool]):
        """`stamp` fills a report's rank and memory, as at a rank's end; `stop_asked`: a stop reached this rank."""
        self.at, self.report, self.stamp, self.stop_asked = spec.hold_at, report, stamp, stop_asked
        self.report_dir, self.verdict_file = Path(spec.report_dir), Path(spec.verdict_file)
        self.timeout = spec.node_timeout_seconds  # a controller that never answers: the ranks fail, not hang
        self.held = False

    def due(self, step: int, max_steps: int) -> bool:
        return not self.held and step == min(self.at, max_steps)

    def wait(self, trainer, step: int) -> None:
        """The probe's report (its evaluation timed, as a probe times it), then the Verdict, or a stop."""
        self.held, began = True, time.perf_counter()
        if trainer.eval_dataset is not None:
            evaluation.timed(trainer, self.report)
        probe = dataclasses.replace(self.report, mode="probe", status="done", global_step=step,
                                    steps=list(self.report.steps), log_history=list(trainer.state.log_history))
        self.stamp(probe)
        probe.save(RankReport.path(self.report_dir, "probe", probe.rank))
        verdict = self._verdict()
        if verdict is not None and not verdict.go_on:
            self.report.status = "ended"  # the controller relaunches or closes: the rank saves nothing more
        self.report.held_seconds += time.perf_counter() - began

    def _verdict(self) -> Verdict | None:
        """The controller's Verdict; None when a stop came first (the step's stop check then saves and stops).
        The ranks poll together, so that all of them leave on the same answer: one rank may read the file a
        poll before another, or see a stop the others do not."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            verdict = Verdict.load(self.verdict_file)
            seen = _agreed([verdict is not None and verdict.go_on, verdict is not None and not verdict.go_on,
                            self.stop_asked()])
            if seen[0] or seen[1]:
                return verdict or Verdict(go_on=seen[0])  # another rank read it first
            if seen[2]:
                return None
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"no verdict in {self.verdict_file} from the controller within {self.timeout} s of the "
                           "probe's end (SFT_NODE_TIMEOUT_SECONDS)")


def _agreed(flags: list[bool]) -> list[bool]:
    """Each flag, true on every rank when it is true on any (one all-reduce: the ranks wait for each other)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return flags
    t = torch.tensor([float(f) for f in flags], device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]
