"""A developer's view of one steady step: torch's profiler around one optimizer step of rank 0, its time
split into the forward, the backward and DeepSpeed's optimizer step, and each into matmuls, attention,
communication, copies, other kernels and idle GPU time.

Turned on by SFTDEV_PROFILE_STEP=N in the ranks' environment (scripts/profile_step.py sets it), never by
a user setting. Writes REPORT_DIR/profile-rank0.json (the split) and profile-rank0.trace.json (a Chrome
trace), and profile-rank0.python.txt: Python's own profile (cProfile) of the same step, the functions that
hold the host while the GPU waits. The phases are timed with a device synchronisation at each boundary,
which a profiled step pays, and cProfile slows Python-heavy code further: profile a run of its own.

With SFTDEV_PROFILE_TIMELINE=1 the step runs as it would, with nothing synchronised and no cProfile: the
profiler records Python's stacks instead, and profile-rank0.gaps.txt says what the host was running while
the GPU had no kernel (the step's idle time by Python stack), the question a synchronised split cannot
answer (its synchronisations make idle time of their own). It also lists every call in the step that made the
host wait for the GPU's queue (torch's sync debug mode: `.item()`, a copy from pageable memory, a device
synchronisation), counted by Python stack: the waits reads.py exists to remove.
"""

from __future__ import annotations

import bisect
import cProfile
import gzip
import io
import json
import os
import pstats
import re
import time
import traceback
import warnings
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
        for e in sorted(events, key=lambda e: -e["size"])[:25]:
            python = [f for f in e.get("frames", []) if f["filename"].endswith(".py")]  # innermost first
            named = [f for f in python if NAMED.search(f["filename"])] or python
            lines.append(f"  {e['size'] / 2**20:10.1f} MiB  " + " < ".join(
                f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in named[:6]))
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "memory-rank0.txt").write_text("\n".join(lines) + "\n")


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
            split = {"profiled_step": self.step, "wall_seconds": round(wall, 4), **_split(self.prof.events())}
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
    return _busy_and_idle(spans, min(s for s, _ in spans), max(e for _, e in spans))[0] if spans else 0.0


# The timeline's GPU activity, the host's events that name what ran, and the Python frames worth naming
# (the libraries a step runs through; torch's own frames are too many to read).
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_OPS = ("cpu_op", "cuda_runtime", "cuda_driver")
NAMED = re.compile(r"(?:^|/)((?:sft|trl|transformers|deepspeed|accelerate|torch/optim|liger_kernel|flash_attn)/.*)")
ENGINE_PHASE = re.compile(r"deepspeed/runtime/engine\.py\(\d+\): (forward|backward|step)$")
SAMPLE_US = 10.0


def gaps_report(trace: dict[str, Any], top: int = 30, queued: bool = False) -> str:
    """What the host ran while the GPU was idle, from a Chrome trace recorded with Python stacks.

    The idle time between the step's first host event (queued: its first kernel, _window_start) and its last
    kernel is sampled every SAMPLE_US; each
    sample is charged to the innermost Python frame of the thread at work and to that thread's innermost
    host op (aten op, CUDA runtime call). torch's profiler reports kernels and stacks but not this join: it is the
    view that says which code keeps the GPU waiting."""
    events, gpu = _spans(trace)
    python = [e for e in events if e.get("cat") == "python_function"]
    if not gpu or not python:
        return "no GPU activity or no Python stacks in the trace (profiled with with_stack on a GPU?)\n"
    threads = sorted({e["tid"] for e in python}, key=str)
    py_at = [_innermost([e for e in python if e["tid"] == t]) for t in threads]
    op_at = [_innermost([e for e in events if e.get("cat") in HOST_OPS and e["tid"] == t]) for t in threads]
    start = _window_start(min(float(e["ts"]) for e in python), gpu, queued)
    end = max(g[1] for g in gpu)
    busy, idle = _busy_and_idle([(s, e) for s, e, _ in gpu], start, end)
    by_kind: dict[str, float] = {}
    for s, e, name in gpu:
        by_kind[_kind(name)] = by_kind.get(_kind(name), 0.0) + (min(e, end) - max(s, start)) / 1e6 * (e > start)
    frames = _frames(python)
    by_stack: dict[str, float] = {}
    by_op: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    for s, e in idle:
        for t, w in _samples(s, e):
            # the thread that entered its innermost frame last is the one at work (the main thread waits in
            # run_backward while autograd's thread runs the backward's hooks)
            here, thread = max(((at(t), i) for i, at in enumerate(py_at)),
                               key=lambda x: float(x[0]["ts"]) if x[0] is not None else float("-inf"))
            chain = frames(here) if here is not None else []
            key = _stack_key(chain)
            by_stack[key] = by_stack.get(key, 0.0) + w
            phase = next((m.group(1) for f in reversed(chain) if (m := ENGINE_PHASE.search(f))), "outside the engine")
            by_phase[phase] = by_phase.get(phase, 0.0) + w
            op = op_at[thread](t)
            name = op["name"] if op is not None else "(no host op)"
            by_op[name] = by_op.get(name, 0.0) + w
    window, idle_total = (end - start) / 1e6, sum(e - s for s, e in idle) / 1e6
    short = sum(e - s for s, e in idle if e - s < 20) / 1e6
    lines = [f"window {window:.4f} s from {_WINDOW_FROM[queued]} to its last kernel; GPU busy "
             f"{busy / 1e6:.4f} s, idle {idle_total:.4f} s in {len(idle)} gaps ({short:.4f} s of it in gaps "
             f"under 20 us: kernels launched back to back)",
             "GPU seconds by kind: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(by_kind.items())),
             "idle by DeepSpeed engine phase the host was in: " + ", ".join(
                 f"{k} {v / 1e6:.4f}" for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])),
             f"\nidle by the innermost named Python frames the host was in (top {top}):"]
    lines += [f"  {v / 1e6:8.4f} s {v / 1e6 / max(idle_total, 1e-9):6.1%}  {k}"
              for k, v in sorted(by_stack.items(), key=lambda kv: -kv[1])[:top]]
    lines.append("\nidle by the innermost host op (aten, CUDA runtime):")
    lines += [f"  {v / 1e6:8.4f} s {v / 1e6 / max(idle_total, 1e-9):6.1%}  {k}"
              for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:top // 2]]
    return "\n".join(lines) + "\n"


def light_report(trace: dict[str, Any], top: int = 15, queued: bool = False) -> str:
    """The GPU's idle time in a step recorded without Python stacks (the host at its own speed: recording stacks
    slows Python several times, and so makes idle time of its own): by the engine's phase the host was in (the
    sft.* ranges), by the innermost host op, and the longest gaps with the kernels around them."""
    events, gpu = _spans(trace)
    host = [e for e in events if e.get("cat") in HOST_OPS + ("user_annotation",)]
    if not gpu or not host:
        return "no GPU activity in the trace (profiled on a GPU?)\n"
    phases = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"][4:]) for e in host
                    if e.get("cat") == "user_annotation" and e["name"].startswith("sft."))
    threads = sorted({e["tid"] for e in host if e.get("cat") in HOST_OPS}, key=str)
    op_at = [_innermost([e for e in host if e.get("cat") in HOST_OPS and e["tid"] == t]) for t in threads]
    start, end = _window_start(min(float(e["ts"]) for e in host), gpu, queued), max(g[1] for g in gpu)
    busy, idle = _busy_and_idle([(s, e) for s, e, _ in gpu], start, end)

    def phase_at(t: float) -> str:
        return next((name for s, e, name in phases if s <= t < e), "outside the engine")

    def op_at_time(t: float) -> str:
        ops = [op for at in op_at if (op := at(t)) is not None]
        return max(ops, key=lambda op: float(op["ts"]))["name"] if ops else "(no host op)"

    by_phase: dict[str, float] = {}
    by_op: dict[str, float] = {}
    gap_op: dict[tuple[float, float], str] = {}  # each gap's host op: the one that held most of it
    for s, e in idle:
        here: dict[str, float] = {}
        for t, w in _samples(s, e):
            phase, op = phase_at(t), op_at_time(t)
            by_phase[phase] = by_phase.get(phase, 0.0) + w
            by_op[op] = by_op.get(op, 0.0) + w
            here[op] = here.get(op, 0.0) + w
        gap_op[(s, e)] = max(here, key=here.__getitem__)
    idle_total = sum(e - s for s, e in idle)
    lines = [f"window {(end - start) / 1e6:.4f} s from {_WINDOW_FROM[queued]} to its last kernel; GPU busy "
             f"{busy / 1e6:.4f} s, idle {idle_total / 1e6:.4f} s in {len(idle)} gaps (no Python stacks recorded)",
             "phases on the host: " + ", ".join(f"{n} {s / 1e3 - start / 1e3:.1f}-{e / 1e3 - start / 1e3:.1f} ms"
                                                 for s, e, n in phases),
             "idle by the engine's phase the host was in: " + ", ".join(
                 f"{k} {v / 1e6:.4f}" for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])),
             f"\nidle by the innermost host op (top {top}):"]
    lines += [f"  {v / 1e6:8.4f} s {v / max(idle_total, 1e-9):6.1%}  {k}"
              for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:top]]
    lines.append(f"\nthe {top} longest gaps: at (ms into the window), length, phase, host op; kernel before / after")
    ends = [g[1] for g in gpu]
    for s, e in sorted(idle, key=lambda g: g[0] - g[1])[:top]:
        i = bisect.bisect_right(ends, s) - 1
        before = gpu[i][2][:60] if i >= 0 else "-"
        after = next((g[2][:60] for g in gpu if g[0] >= e), "-")
        lines.append(f"  {(s - start) / 1e3:8.2f} {(e - s) / 1e3:7.3f} ms  {phase_at((s + e) / 2):<10} "
                     f"{gap_op[(s, e)][:50]:<50}  {before} / {after}")
    return "\n".join(lines) + "\n"


_WINDOW_FROM = {False: "the step's first host event",
                True: "the step's first kernel (before it, the GPU ran the previous step's work, not recorded)"}


def _window_start(host_start: float, gpu: list[tuple[float, float, str]], queued: bool) -> float:
    """Where the step's window starts: at its first host event, or, where the GPU was still running work queued
    before the trace began (a profiler started a step early), at the first kernel the trace holds; the time
    before it is that earlier work's, which the trace cannot show, not idle time."""
    return max(host_start, gpu[0][0]) if queued else host_start


def _spans(trace: dict[str, Any]) -> tuple[list[dict], list[tuple[float, float, str]]]:
    """A Chrome trace's complete events, and its GPU activity as (start, end, name), by start."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
                 if e.get("cat") in GPU_CATS)
    return events, gpu


def _samples(start: float, end: float):
    """An idle gap cut into samples of SAMPLE_US (the last one shorter): (its middle, its width) each."""
    t = start
    while t < end:
        w = min(SAMPLE_US, end - t)
        yield t + w / 2, w
        t += w


def _busy_and_idle(spans: list[tuple[float, float]], start: float, end: float):
    """The union of the spans inside [start, end], and the gaps between them."""
    busy, idle, cursor = 0.0, [], start
    for s, e in sorted(spans):
        s, e = max(s, start), min(e, end)
        if e <= cursor:
            continue
        if s > cursor:
            idle.append((cursor, s))
        busy += e - max(s, cursor)
        cursor = e
    if cursor < end:
        idle.append((cursor, end))
    return busy, idle


def _innermost(events: list[dict]):
    """A lookup t -> the innermost event that holds t (events of one thread nest), by one sweep into
    segments where the innermost event stays the same."""
    marks: list[tuple[float, dict | None]] = []
    stack: list[tuple[float, dict]] = []
    for e in sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        s = float(e["ts"])
        while stack and stack[-1][0] <= s:
            done = stack.pop()[0]
            marks.append((done, stack[-1][1] if stack else None))
        stack.append((s + float(e["dur"]), e))
        marks.append((s, e))
    while stack:
        done = stack.pop()[0]
        marks.append((done, stack[-1][1] if stack else None))
    times = [m[0] for m in marks]

    def at(t: float) -> dict | None:
        i = bisect.bisect_right(times, t) - 1
        return marks[i][1] if i >= 0 else None

    return at


def _frames(python: list[dict]):
    """A lookup event -> its Python stack, outermost first, by the profiler's parent ids."""
    by_id = {e["args"]["Python id"]: e for e in python if "Python id" in e.get("args", {})}

    def chain(e: dict) -> list[str]:
        out = []
        while e is not None and len(out) < 200:
            out.append(re.sub(r" at 0x[0-9a-f]+", "", e["name"]))
            e = by_id.get(e.get("args", {}).get("Python parent id"))
        return out[::-1]

    return chain


def _stack_key(chain: list[str], named: int = 3) -> str:
    """The last `named` frames from the libraries in NAMED, shortened to their package path, and the
    innermost frame when it is not one of them (a builtin such as Tensor.item, torch's own code)."""
    short = [m.group(1) for f in chain if (m := NAMED.search(f))]
    key = short[-named:]
    if chain and not NAMED.search(chain[-1]):
        key.append(chain[-1][-80:])
    return " > ".join(key) or "(no Python frame)"
