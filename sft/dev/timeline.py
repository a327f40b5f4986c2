"""Reading a profiled step's trace (dev/profiling.py records it): its GPU time by phase and kind of kernel, and
what the host ran while the GPU had nothing to do. A developer's tool, never imported by the job."""

from __future__ import annotations

import bisect
import re
from typing import Any

import torch

# Kernel names, lower-cased, by what they do (cuBLAS/CUTLASS matmuls, FlashAttention/flex attention's
# Triton template, NCCL, copies); the first match wins, the rest is "other" (fused elementwise, norms, loss).
KINDS = (
    ("attention", ("flash", "fmha", "attention", "flex")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "sm90", "matmul")),
    ("communication", ("nccl", "all_reduce", "allreduce", "reduce_scatter", "all_gather", "allgather")),
    ("copies", ("memcpy", "memset", "copy")),
)
PHASES = ("forward", "backward", "step")


def _kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, words in KINDS if any(w in low for w in words)), "other")


def split_by_phase(events) -> dict[str, Any]:
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
