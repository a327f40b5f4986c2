"""A checkpoint's save on a GPU machine: tensors the size of ZeRO-2's state of a model on one GPU (the bf16
weights, the fp32 master weights and Adam's moments as flat partitions) saved in one file by torch.save and by
the job's writer (sft/ranks/patches/saving.py) in turns, A/B/A/B; with --pieces, where torch.save's time goes (the
copy off the GPU, the write, torch's use_pinned_memory_for_d2h off and on). Prints one line per figure and
writes them as JSON.

    python scripts/bench_checkpoint_save.py FOLDER [--params 4022468096] [--pieces | --background] [--json OUT.json]

With --background, the job's writer in the background (sft/ranks/patches/background.py), three turns: how long the
steps are held (the save's return and the GPU's copy into host memory), how long the files take to be written
behind them, and bf16 matrix products' speed alone and while the files are written (a step's work going on).

FOLDER is where the files are written (a tmpfs to leave the disk out); it needs 14 bytes x params free, and
the host twice that in memory. Figures: docs/speed.md, 2026-12-03.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.serialization import config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sft.ranks.patches import saving  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--params", type=int, default=4_022_468_096, help="elements per tensor (Qwen3-4B's)")
    parser.add_argument("--pieces", action="store_true", help="where torch.save's time goes, piece by piece")
    parser.add_argument("--background", action="store_true", help="the job's writer in the background")
    parser.add_argument("--json", default="", help="also write the figures here")
    args = parser.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    n, figures = args.params, {}

    def timed(name, fn):
        torch.cuda.synchronize()
        began = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        figures[name] = round(time.perf_counter() - began, 2)
        print(f"{name}: {figures[name]} s", flush=True)
        return result

    def save(obj, name="a.pt", by=torch.save):
        path = os.path.join(args.folder, name)
        by(obj, path)
        os.remove(path)

    gb = n * 4 / 1e9
    weights = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    master = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    moment = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    config.save.compute_crc32 = False  # as the job saves (sft/ranks/patches/)
    if args.background:
        state = {"module": weights, "fp32": master, "exp_avg": moment,
                 "exp_avg_sq": torch.empty_like(moment).normal_()}
        background_turns(args.folder, state, figures)
        return finish(args, figures, n)
    if not args.pieces:  # the same ZeRO-2-sized state in one file, the job's writer against torch.save
        state = {"module": weights, "fp32": master, "exp_avg": moment,
                 "exp_avg_sq": torch.empty_like(moment).normal_()}
        size = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
        for turn, (name, by) in enumerate([("torch.save", torch.save), ("saving.save", saving.save)] * 2):
            timed(f"{name}: {size:.1f} GB from the GPU in one file (turn {turn + 1})", lambda: save(state, by=by))
        return finish(args, figures, n)
    # first, before this process has pinned any memory: the first pinned turn pays for pinning it, as a job's
    # first save does (torch's caching host allocator keeps the pinned blocks for the next)
    for turn, pinned_d2h in enumerate((False, True, False, True)):
        config.save.use_pinned_memory_for_d2h = pinned_d2h
        timed(f"torch.save {2 * gb:.1f} GB fp32 (two tensors) from the GPU, pinned copies "
              f"{'on' if pinned_d2h else 'off'} (turn {turn + 1})", lambda: save({"a": master, "b": moment}))
    config.save.use_pinned_memory_for_d2h = False
    if hasattr(torch.cuda, "host_memory_stats"):  # what the pinned turns left pinned in this process
        stats = torch.cuda.host_memory_stats()
        figures["pinned host memory kept after the turns"] = {k: v for k, v in stats.items() if "current" in k}
        print(f"pinned host memory kept after the turns: {figures['pinned host memory kept after the turns']}")
    host = timed(f"copy {gb:.1f} GB fp32 GPU -> pageable host memory", master.cpu)
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
    timed(f"copy {gb:.1f} GB fp32 GPU -> pinned host memory (allocated before)",
          lambda: pinned.copy_(master, non_blocking=True))
    config.save.compute_crc32 = True
    timed(f"torch.save {gb:.1f} GB fp32 from host memory, CRC32 on", lambda: save({"t": host}))
    config.save.compute_crc32 = False  # as the job saves (sft/ranks/patches/)
    timed(f"torch.save {gb:.1f} GB fp32 from host memory, CRC32 off", lambda: save({"t": host}))
    timed(f"torch.save {gb:.1f} GB fp32 from the GPU, CRC32 off", lambda: save({"t": master}))
    timed(f"torch.save {gb / 2:.1f} GB bf16 from the GPU, CRC32 off", lambda: save({"t": weights}))
    finish(args, figures, n)


def background_turns(folder: str, state: dict, figures: dict) -> None:
    """Three saves through the background writer; the steps' stand-in (bf16 products) timed alone and during each
    write."""
    from sft.ranks.patches import background

    writer = background.Writer()
    size = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

    def products(seconds: float) -> float:  # TFLOP/s of back-to-back products for about `seconds`
        torch.cuda.synchronize()
        began, count = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()
            count += 20
        return round(count * 2 * 8192**3 / (time.perf_counter() - began) / 1e12, 1)

    figures["products alone, TFLOP/s"] = products(3.0)
    for turn in range(1, 4):
        path = os.path.join(folder, f"checkpoint-{turn}", f"global_step{turn}", "optim.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.cuda.synchronize()
        began = time.perf_counter()
        saving.save(state, path, writer)
        torch.cuda.synchronize()  # the training's stream waits for the copy: the steps are held this long
        held = time.perf_counter() - began
        during = products(2.0)
        writer.wait()
        written = time.perf_counter() - began
        key = f"turn {turn}: {size:.1f} GB"
        figures[key] = {"steps held s": round(held, 2), "written s": round(written, 2),
                        "products during the write, TFLOP/s": during, "arena GB": round(writer.arena.bytes / 1e9, 1)}
        print(f"{key}: {figures[key]}", flush=True)
        os.remove(path)


def finish(args, figures: dict, n: int) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "params": n, "seconds": figures}, f, indent=1)


if __name__ == "__main__":
    main()
