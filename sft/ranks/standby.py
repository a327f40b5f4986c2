"""A process of the job started before the controller has decided: it imports its libraries meanwhile, then waits
for the spec of the launch it joins and runs it as its program would. A job that ends first kills it, silent.

Started by the controller's standby (controller/standby.py), never by hand:
    python -m sft.ranks.standby PROGRAM START.json
PROGRAM is sft.ranks.train (every rank, through the launcher) or sft.ranks.attention_ahead (FlashAttention-4's
kernels). START.json is a Start (handoff.py) in the standby's private folder (a StandbyFolder), written once.

Why: a rank's imports (torch, Transformers, TRL, DeepSpeed, flash-attn-4) take seconds, and they began only after the
controller had checked the settings' inputs, read the data and decided, which took longer still (measured:
docs/speed.md, 'the ranks start with the job'). Started with the job, they run meanwhile. What the imports print is held
back and said once the spec comes, so that the log reads as a launch's started then; a process killed before says
nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ..handoff import StandbyFolder, Start
from ..lifeline import die_with_parent

POLL_SECONDS = 0.05

# What each program imports before it can read its spec (build_trainer's imports; compile_ahead's), and what it
# imports on GPUs only. A module not installed is skipped; one that fails is left to the program, which imports it
# again after the spec and fails there, as it would have.
PRELOAD = {
    "sft.ranks.train": ("sft.ranks.train", "sft.ranks.patches", "sft.ranks.patches.reads",
                        "sft.data.sources", "sft.tracking", "transformers.trainer", "trl.trainer.sft_trainer",
                        "deepspeed"),
    "sft.ranks.attention_ahead": ("sft.ranks.attention_ahead", "transformers.modeling_utils",
                                  "trl.trainer.sft_trainer"),
}
ON_GPU = {
    "sft.ranks.train": ("torch._inductor.compile_fx", "liger_kernel.transformers", "flash_attn.cute"),
    "sft.ranks.attention_ahead": ("transformers.integrations.flash_attention", "flash_attn.cute"),
}


def main(argv: list[str]) -> int:
    program, start_path = [a for a in argv if not a.startswith("--")][:2]  # the deepspeed launcher adds --local_rank
    die_with_parent()  # the launcher's end (the controller's, for attention_ahead) is this process's
    began = time.monotonic()
    with held_output() as held:
        preload(program)
    imported = time.monotonic()
    folder = StandbyFolder(Path(start_path).parent)
    start = wait(Path(start_path), folder)
    if start is None:  # the controller ended before handing a spec over: what its processes made here goes too
        shutil.rmtree(folder.path, ignore_errors=True)
        return 0
    made_again(folder)
    say(held)
    if program == "sft.ranks.train" and os.environ.get("RANK", "0") == "0":
        print(f"standby: rank 0 imported its libraries in {imported - began:.1f} s while the controller decided, "
              f"then waited {time.monotonic() - imported:.1f} s for its spec", flush=True)
    return importlib.import_module(program).main(start.spec)


def preload(program: str) -> None:
    import torch

    modules = PRELOAD[program] + (ON_GPU[program] if torch.cuda.is_available() else ())
    for module in modules:
        try:
            if importlib.util.find_spec(module.split(".")[0]) is not None:
                importlib.import_module(module)
        except Exception:  # noqa: S110 - the program imports it again, and says why it fails there
            pass


def made_again(folder: StandbyFolder) -> None:
    """The folders the imports made in the cache before the Start (a library makes its cache's folders at import,
    and writes in them later), made where the cache's link points now: the output folder's compile cache."""
    for made in sorted(folder.cache_before_start.rglob("*")):
        if made.is_dir():
            (folder.cache / made.relative_to(folder.cache_before_start)).mkdir(parents=True, exist_ok=True)


def wait(path: Path, folder: StandbyFolder) -> Start | None:
    """The controller's Start; None once the controller no longer waits (it ended, or died)."""
    while (start := Start.load(path)) is None:
        if not folder.waits():
            return None
        time.sleep(POLL_SECONDS)
    return start


@contextmanager
def held_output() -> Iterator[dict[int, tuple[int, BinaryIO]]]:
    """File descriptors 1 and 2 into files while the block runs (a library's logger may hold either): for `say`."""
    sys.stdout.flush()
    sys.stderr.flush()
    held = {fd: (os.dup(fd), tempfile.TemporaryFile()) for fd in (1, 2)}
    for fd, (_, file) in held.items():
        os.dup2(file.fileno(), fd)
    try:
        yield held
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, (saved, _) in held.items():
            os.dup2(saved, fd)
            os.close(saved)


def say(held: dict[int, tuple[int, BinaryIO]]) -> None:
    """What the held block printed, to where it would have gone."""
    for fd, (_, file) in held.items():
        file.seek(0)
        with open(fd, "wb", closefd=False) as out:
            out.write(file.read())
        file.close()


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # As sft/ranks/train.py leaves: its report written, without the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
