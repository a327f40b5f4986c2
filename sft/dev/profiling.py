"""A developer's view of one steady step: torch's profiler around one optimizer step of rank 0, its time
split into the forward, the backward and DeepSpeed's optimizer step, and each into matmuls, attention,
communication, copies, other kernels and idle GPU time.

Turned on by SFTDEV_PROFILE_STEP=N in the ranks' environment, never by a user setting (the rank program loads
sft/dev/ only when such a variable asks: sft/ranks/devtools.py). Writes REPORT_DIR/profile-rank0.json (the split) and
profile-rank0.trace.json (a Chrome trace), and profile-rank0.python.txt: Python's own profile (cProfile) of the same
step, the functions that hold the host while the GPU waits. The phases are timed with a device synchronisation at each
boundary, which a profiled step pays, and cProfile slows Python-heavy code further: profile a run of its own.

With SFTDEV_PROFILE_TIMELINE=1 the step runs as it would, with nothing synchronised and no cProfile: the
profiler records Python's stacks instead, and profile-rank0.gaps.txt says what the host was running while
the GPU had no kernel (the step's idle time by Python stack), the question a synchronised split cannot
answer (its synchronisations make idle time of their own). It also lists every call in the step that made the
host wait for the GPU's queue (torch's sync debug mode: `.item()`, a copy from pageable memory, a device
synchronisation), counted by Python stack: the waits reads.py exists to remove.
"""

from __future__ import annotations

import cProfile
import gzip
import io
import json
import os
import pstats
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .timeline import NAMED, PHASES, gaps_report, light_report, split_by_phase



def callback(report_dir: str) -> TrainerCallback | None:
    """The profiling callback when SFTDEV_PROFILE_STEP asks for one on this rank (rank 0), else None."""
    step = os.environ.get("SFTDEV_PROFILE_STEP")
    if not step or int(os.environ.get("RANK", "0")) != 0:
        return None
    timeline = {"1": "stacks", "stacks": "stacks", "light": "light"}.get(os.environ.get("SFTDEV_PROFILE_TIMELINE", ""))
    return StepProfile(int(step), Path(report_dir), timeline=timeline)


def memory_callback(report_dir: str) -> TrainerCallback | None:
    """SFTDEV_MEMORY_SNAPSHOT=N (rank 0, CUDA): torch's allocator history from the training's start to the end
    of step N, written as memory-rank0.txt: each segment the allocator reserved from the device, largest
    first, with the Python frames that asked for it (what made the peak the planner predicts)."""
    step = os.environ.get("SFTDEV_MEMORY_SNAPSHOT")
    if not step or int(os.environ.get("RANK", "0")) != 0 or not torch.cuda.is_available():
        return None
    return MemorySnapshot(int(step), Path(report_dir))


class MemorySnapshot(TrainerCallback):
    def __init__(self, step: int, out: Path):
        self.step, self.out = step, out
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)  # before DeepSpeed allocates

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = [e for trace in snapshot.get("device_traces", []) for e in trace if e.get("action") == "segment_alloc"]
        lines = [f"after step {self.step}: reserved {torch.cuda.memory_reserved() / 2**30:.3f} GiB, peak reserved "
                 f"{torch.cuda.max_memory_reserved() / 2**30:.3f} GiB; {len(events)} segments reserved since the start "
                 f"({sum(e['size'] for e in events) / 2**30:.3f} GiB, freed ones included), largest first:"]
        lines += [_segment_line(e) for e in sorted(events, key=lambda e: -e["size"])[:25]]
        at_peak = _live_at_peak(snapshot)
        lines.append(f"segments reserved at the history's highest point ({sum(e['size'] for e in at_peak) / 2**30:.3f} "
                     "GiB), largest first:")
        lines += [_segment_line(e) for e in sorted(at_peak, key=lambda e: -e["size"])[:40]]
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "memory-rank0.txt").write_text("\n".join(lines) + "\n")


def _segment_line(e: dict) -> str:
    python = [f for f in e.get("frames", []) if f["filename"].endswith(".py")]  # innermost first
    named = [f for f in python if NAMED.search(f["filename"])] or python
    return f"  {e['size'] / 2**20:10.1f} MiB  " + " < ".join(
        f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in named[:6])


def _live_at_peak(snapshot: dict) -> list[dict]:
    """The segments reserved from the device when, in the recorded history, the most were: the peak's makeup."""
    live: dict[int, dict] = {}
    best: list[dict] = []
    total = best_total = 0
    for e in (e for trace in snapshot.get("device_traces", []) for e in trace):
        if e.get("action") == "segment_alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > best_total:
                best, best_total = list(live.values()), total
        elif e.get("action") == "segment_free" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    return best


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepProfile(TrainerCallback):
    def __init__(self, step: int, out: Path, timeline: str | None = None):
        self.step, self.out, self.trainer, self.timeline = step, out, None, timeline
        self.prof: Any = None
        self.restore: list[tuple[Any, str, Any]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        if self.timeline and state.global_step + 2 == self.step:
            # The profiler's start waits for the GPU's queue, which would leave the profiled step's start with
            # nothing queued and so idle time of its own: it starts a step early, warming up, and records from
            # the next step's start on, with that step's queue as it is.
            self.prof = torch.profiler.profile(activities=activities, with_stack=self.timeline == "stacks",
                                               schedule=torch.profiler.schedule(wait=0, warmup=1, active=1))
            self.prof.__enter__()
            return
        if state.global_step + 1 != self.step:
            return
        if self.timeline:
            if self.timeline == "light":  # the phases as ranges, nothing synchronised, no Python stacks
                self._mark_phases(self.trainer.model_wrapped, synchronised=False)
            self.warmed = self.prof is not None  # started a step early: the GPU still runs that step's work
            if self.warmed:
                self.prof.step()  # from warming up to recording
            else:  # the launch's first step: nothing earlier to warm up in
                self.prof = torch.profiler.profile(activities=activities, with_stack=self.timeline == "stacks")
                self.prof.__enter__()
            self.syncs = Syncs().__enter__()
            self.began = time.perf_counter()
            return
        self._mark_phases(self.trainer.model_wrapped)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.__enter__()
        _sync()
        self.python = cProfile.Profile()
        self.python.enable()
        self.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.prof is None or state.global_step != self.step:  # not while warming up, a step before
            return
        if self.timeline:
            return self._end_timeline()
        _sync()
        wall = time.perf_counter() - self.began
        self.python.disable()
        self.prof.__exit__(None, None, None)
        self._restore()
        self.out.mkdir(parents=True, exist_ok=True)
        try:  # a developer's tool: what it cannot read is reported, the training goes on
            self.prof.export_chrome_trace(str(self.out / "profile-rank0.trace.json"))
            split = {"profiled_step": self.step, "wall_seconds": round(wall, 4), **split_by_phase(self.prof.events())}
        except Exception as e:  # noqa: BLE001
            split = {"profiled_step": self.step, "wall_seconds": round(wall, 4), "error": f"{type(e).__name__}: {e}"}
        (self.out / "profile-rank0.json").write_text(json.dumps(split, indent=1))
        (self.out / "profile-rank0.python.txt").write_text(_python_table(self.python))
        self.prof = None

    def _end_timeline(self) -> None:
        syncs, self.syncs = self.syncs, None
        syncs.__exit__(None, None, None)
        _sync()  # after the step: its kernels end inside the trace
        wall = time.perf_counter() - self.began
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        self._restore()
        self.out.mkdir(parents=True, exist_ok=True)
        trace = self.out / "profile-rank0.trace.json"
        report = gaps_report if self.timeline == "stacks" else light_report
        try:  # a developer's tool: what it cannot read is reported, the training goes on
            prof.export_chrome_trace(str(trace))
            text = f"profiled step {self.step}, {wall:.4f} s on the host, nothing synchronised\n" + report(
                json.loads(trace.read_text()), queued=self.warmed)
        except Exception as e:  # noqa: BLE001
            text = f"profiled step {self.step}: the timeline could not be read: {type(e).__name__}: {e}\n"
        (self.out / "profile-rank0.gaps.txt").write_text(text + "\n" + syncs.report())
        if trace.exists():
            with open(trace, "rb") as f, gzip.open(f"{trace}.gz", "wb") as g:
                g.write(f.read())
            trace.unlink()

    def _restore(self) -> None:
        for engine, name, original in self.restore:
            setattr(engine, name, original)
        self.restore = []

    def _mark_phases(self, engine, synchronised: bool = True) -> None:
        """Wrap DeepSpeed's forward, backward and step on this engine in named ranges, synchronised at their
        bounds unless told not to (instrumentation of the one profiled step; the methods are restored after it)."""
        sync = _sync if synchronised else (lambda: None)
        for name in PHASES:
            original = getattr(engine, name)

            def marked(*a, __original=original, __name=name, **kw):
                sync()
                with torch.profiler.record_function(f"sft.{__name}"):
                    result = __original(*a, **kw)
                    sync()
                return result

            self.restore.append((engine, name, original))
            setattr(engine, name, marked)


class Syncs:
    """The calls that made the host wait for the GPU's queue while it is entered, with their Python stacks:
    torch's sync debug mode warns at each, in whichever thread (the backward's hooks run in autograd's)."""

    def __enter__(self) -> Syncs:
        self.stacks: dict[str, int] = {}
        self.catching = warnings.catch_warnings()
        self.catching.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._seen
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
        self.catching.__exit__(*exc)

    def _seen(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchronizing" not in str(message):
            return
        frames = [f"{m.group(1)}({f.lineno}): {f.name}" for f in traceback.extract_stack()[:-1]
                  if (m := NAMED.search(f.filename.replace("\\", "/"))) and "profiling.py" not in f.filename]
        key = " > ".join(frames[-4:]) or f"{filename}({lineno})"
        self.stacks[key] = self.stacks.get(key, 0) + 1

    def report(self) -> str:
        total = sum(self.stacks.values())
        lines = [f"host waits for the GPU's queue in the step: {total}"]
        lines += [f"  {n:4d}  {k}" for k, n in sorted(self.stacks.items(), key=lambda kv: -kv[1])]
        return "\n".join(lines) + "\n"


def _python_table(profile: cProfile.Profile) -> str:
    """The step's Python functions by cumulative time, then by their own time."""
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    return text.getvalue()
