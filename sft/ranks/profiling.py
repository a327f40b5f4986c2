"""A developer's view of one steady step: torch's profiler around one optimizer step of rank 0, its time
split into the forward, the backward and DeepSpeed's optimizer step, and each into matmuls, attention,
communication, copies, other kernels and idle GPU time.

Turned on by SFTDEV_PROFILE_STEP=N in the ranks' environment (scripts/profile_step.py sets it), never by
a user setting. Writes REPORT_DIR/profile-rank0.json (the split) and profile-rank0.trace.json (a Chrome
trace), and profile-rank0.python.txt: Python's own profile (cProfile) of the same step, the functions that
hold the host while the GPU waits. The phases are timed with a device synchronisation at each boundary,
which a profiled step pays, and cProfile slows Python-heavy code further: profile a run of its own.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

# Kernel names, lower-cased, by what they do (cuBLAS/CUTLASS matmuls, FlashAttention/flex attention's
# Triton template, NCCL, copies); the first match wins, the rest is "other" (fused elementwise, norms, loss).
KINDS = (
    ("attention", ("flash", "fmha", "attention", "flex")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "sm90", "matmul")),
    ("communication", ("nccl", "all_reduce", "allreduce", "reduce_scatter", "all_gather", "allgather")),
    ("copies", ("memcpy", "memset", "copy")),
)
PHASES = ("forward", "backward", "step")


def callback(report_dir: str) -> TrainerCallback | None:
    """The profiling callback when SFTDEV_PROFILE_STEP asks for one on this rank (rank 0), else None."""
    step = os.environ.get("SFTDEV_PROFILE_STEP")
    if not step or int(os.environ.get("RANK", "0")) != 0:
        return None
    return StepProfile(int(step), Path(report_dir))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepProfile(TrainerCallback):
    def __init__(self, step: int, out: Path):
        self.step, self.out, self.trainer = step, out, None
        self.prof: Any = None
        self.restore: list[tuple[Any, str, Any]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 != self.step:
            return
        self._mark_phases(self.trainer.model_wrapped)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.__enter__()
        _sync()
        self.python = cProfile.Profile()
        self.python.enable()
        self.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.prof is None:
            return
        _sync()
        wall = time.perf_counter() - self.began
        self.python.disable()
        self.prof.__exit__(None, None, None)
        for engine, name, original in self.restore:
            setattr(engine, name, original)
        self.out.mkdir(parents=True, exist_ok=True)
        try:  # a developer's tool: what it cannot read is reported, the training goes on
            self.prof.export_chrome_trace(str(self.out / "profile-rank0.trace.json"))
            split = {"profiled_step": self.step, "wall_seconds": round(wall, 4), **_split(self.prof.events())}
        except Exception as e:  # noqa: BLE001
            split = {"profiled_step": self.step, "wall_seconds": round(wall, 4), "error": f"{type(e).__name__}: {e}"}
        (self.out / "profile-rank0.json").write_text(json.dumps(split, indent=1))
        (self.out / "profile-rank0.python.txt").write_text(_python_table(self.python))
        self.prof = None

    def _mark_phases(self, engine) -> None:
        """Wrap DeepSpeed's forward, backward and step on this engine in named, synchronised ranges
        (instrumentation of the one profiled step; the methods are restored after it)."""
        for name in PHASES:
            original = getattr(engine, name)

            def marked(*a, __original=original, __name=name, **kw):
                _sync()
                with torch.profiler.record_function(f"sft.{__name}"):
                    result = __original(*a, **kw)
                    _sync()
                return result

            self.restore.append((engine, name, original))
            setattr(engine, name, marked)


def _python_table(profile: cProfile.Profile) -> str:
    """The step's Python functions by cumulative time, then by their own time."""
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    return text.getvalue()


def _kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, words in KINDS if any(w in low for w in words)), "other")


def _split(events) -> dict[str, Any]:
    """GPU time by phase (the sft.forward/backward/step ranges) and by kernel kind; idle: the phase's wall
    time the GPU ran no kernel."""
    ranges = {p: [(e.time_range.start, e.time_range.end) for e in events if e.name == f"sft.{p}"] for p in PHASES}
    # the sft.* ranges also appear on the GPU's timeline as annotations: they are spans, not kernels
    kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
               and not e.name.startswith("sft.")]
    out: dict[str, Any] = {}
    for phase, spans in ranges.items():
        inside = [k for k in kernels if any(s <= k.time_range.start < e for s, e in spans)]
        wall = sum(e - s for s, e in spans) / 1e6
        by_kind: dict[str, float] = {}
        for k in inside:
            by_kind[_kind(k.name)] = by_kind.get(_kind(k.name), 0.0) + (k.time_range.end - k.time_range.start) / 1e6
        busy = _union([(k.time_range.start, k.time_range.end) for k in inside]) / 1e6
        out[phase] = {"wall_seconds": round(wall, 4), "kernels_seconds": {k: round(v, 4) for k, v in
                                                                          sorted(by_kind.items())},
                      "idle_seconds": round(max(wall - busy, 0.0), 4), "calls": len(spans)}
    totals: dict[str, float] = {}
    for k in kernels:
        totals[k.name] = totals.get(k.name, 0.0) + (k.time_range.end - k.time_range.start) / 1e6
    out["top_kernels_seconds"] = [[n, round(s, 4)] for n, s in sorted(totals.items(), key=lambda kv: -kv[1])[:25]]
    return out


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total
