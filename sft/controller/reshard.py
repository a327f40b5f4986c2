"""A resume on another number of ranks, in the controller before the launch: the checkpoint converted to
DeepSpeed's universal checkpoint, which an engine loads on any number of ranks (planner/reshard.py decides
when, and with which split; the DeepSpeed config of that start says "load_universal").

    OUTPUT/resharded/checkpoint-N/           what this start resumes from (the original is only read):
        trainer_state.json, scheduler.pt,    the Trainer's files, copied: step, learning-rate schedule, logs
        rng_state*.pth, sft_job.json, ...
        global_stepN_universal/, latest_universal     DeepSpeed's ds_to_universal output: zero/NAME/ holds
                                                      each parameter's fp32 weights and Adam moments whole
    OUTPUT/run/reshard.log                   the converter's output

The folder is built under a temporary name and renamed when complete, so a start killed mid-conversion
leaves nothing that is trusted; a later start finds a complete one and uses it again. Once the run has
saved a newer checkpoint of its own the folder is removed (tidy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import checkpoints, exitcodes
from ..checkpoints import folder_bytes, free_disk
from ..planner.reshard import Reshard, ranks
from .output import Paths

FOLDER = "resharded"
# Left out of the copy: the 16-bit model weights (the universal checkpoint holds the fp32 ones, and the
# Trainer loads none when DeepSpeed resumes) and `latest`, which names the ZeRO shards not copied.
NOT_COPIED = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "latest")


class Failed(Exception):
    """The conversion cannot be made here; the message says why and what to do."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Converted:
    path: Path  # what the ranks resume from
    summary: dict[str, Any]  # for run/summary.json


def convert(source: Path, change: Reshard, paths: Paths) -> Converted:
    """The checkpoint `source` as a universal checkpoint in OUTPUT/resharded/ (raises Failed)."""
    target = paths.out / FOLDER / source.name
    began = time.monotonic()
    reused = target.is_dir()  # a universal checkpoint loads on any number of ranks
    if not reused:
        _build(source, target, paths.run / "reshard.log")
    seconds = round(time.monotonic() - began, 1)
    done = "converted by an earlier start" if reused else f"converted in {seconds:g} s"
    print(f"reshard: {source.name} of {ranks(change.from_world)}, for {ranks(change.to_world)}, {done}: {target}",
          flush=True)
    return Converted(target, {**change.to_dict(), "source": str(source), "converted": str(target),
                              "seconds": seconds, "reused": reused})


def _build(source: Path, target: Path, log: Path) -> None:
    tag = _tag(source)
    work = target.with_name(f".{target.name}.partial")
    shutil.rmtree(work, ignore_errors=True)  # a conversion killed before it finished
    _check_room(source / tag, target.parent)
    work.mkdir(parents=True)
    try:
        for f in source.iterdir():
            if f.is_file() and f.name not in NOT_COPIED:
                shutil.copy2(f, work / f.name)
        _rank_files(work)
        # the converter names the universal folder in latest_universal beside it: the file the engine reads
        _run_converter(source / tag, work / f"{tag}_universal", log)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)  # half a conversion takes room and is never used
        raise
    work.rename(target)


def _tag(source: Path) -> str:
    """DeepSpeed's folder in the checkpoint (`latest` names it: checkpoints.problem checked it is there)."""
    return (source / "latest").read_text().strip()


def _check_room(shards: Path, where: Path) -> None:
    """The converter writes each parameter's state twice (its fragments, then the merged files), each about
    the size of the ZeRO shards: room for both, before it starts."""
    where.mkdir(parents=True, exist_ok=True)
    need, free = 2 * folder_bytes(shards), free_disk(str(where))
    if need > free:
        raise Failed(f"converting the checkpoint for this number of ranks needs about {need / 1e9:.3g} GB in "
                     f"{where} (twice its ZeRO shards) and {free / 1e9:.3g} GB are free: free space, or start on "
                     "as many ranks as wrote it", exitcodes.PREFLIGHT)


def _rank_files(folder: Path) -> None:
    """The Trainer reads rng_state.pth on one rank and rng_state_R.pth on several: each name is given rank 0's
    state where the other count wrote it (ranks with no file of their own start from the seed's state, as the
    Trainer does; only dropout draws from it)."""
    one, first = folder / "rng_state.pth", folder / "rng_state_0.pth"
    if first.is_file() and not one.exists():
        shutil.copy2(first, one)
    elif one.is_file() and not first.exists():
        shutil.copy2(one, first)


def _run_converter(shards: Path, out: Path, log: Path) -> None:
    """DeepSpeed's ds_to_universal, in its own process: it forks workers and loads whole shards, which the
    controller need not hold. --inject_missing_state: the ZeRO-1/2 converter asks for the parallelism map
    Megatron-DeepSpeed writes into its checkpoints, which a Hugging Face model has none of; with data
    parallelism only, the empty map it injects is the right one (ZeRO-3's converter reads no map)."""
    workers = max(1, min(4, len(os.sched_getaffinity(0))))
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(shards),
               "--output_folder", str(out), "--inject_missing_state", "--num_extract_workers", str(workers),
               "--num_merge_workers", str(min(2, workers))]
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"reshard: converting {shards} to DeepSpeed's universal checkpoint (log: {log})", flush=True)
    with log.open("w") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        raise Failed(f"DeepSpeed's ds_to_universal could not convert {shards} (exit code {code}): "
                     f"{lines[-1] if lines else 'no output'} (whole log: {log}). Start on as many ranks as wrote "
                     "the checkpoint to resume it as it is", exitcodes.FAILED)


def tidy(paths: Paths) -> None:
    """Remove the converted checkpoints older than the newest complete one of the run: no start resumes from
    them again, and each is about a checkpoint's size."""
    newest = checkpoints.latest_complete(paths.out)
    folder = paths.out / FOLDER
    if newest is None or not folder.is_dir():
        return
    for converted in folder.iterdir():
        match = checkpoints.CHECKPOINT.match(converted.name)
        if converted.name.endswith(".partial"):
            why = "a conversion that a start killed mid-way left"
        elif match and int(match.group(1)) < checkpoints.step_of(newest):
            why = f"the run has a newer checkpoint ({newest.name})"
        else:
            continue
        shutil.rmtree(converted, ignore_errors=True)
        print(f"reshard: removed {converted}: {why}", flush=True)
    if not any(folder.iterdir()):
        folder.rmdir()
