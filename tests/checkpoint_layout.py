"""Checkpoint folders on disk in the exact layout the Trainer + DeepSpeed write, without training.

REAL_LAYOUT is the file list of a real checkpoint, read from one the job wrote (ZeRO-2, two ranks):
    SFT_MODEL=demo/tiny-qwen3 SFT_DATASET=demo/chat.jsonl SFT_OUTPUT_DIR=/tmp/realckpt SFT_PROBE_STEPS=0 \
    SFT_MAX_STEPS=8 SFT_SAVE_STEPS=4 SFT_ZERO_STAGE=2 python entrypoint.py
{step} and {rank} stand for the step and each rank. trainer_state.json is written last, as the
Trainer does after DeepSpeed's save: without it, sft/checkpoints.py calls the checkpoint incomplete.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

REAL_LAYOUT = (
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "global_step{step}/mp_rank_00_model_states.pt",
    "global_step{step}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
    "latest",
    "model.safetensors",
    "rng_state_{rank}.pth",
    "scheduler.pt",
    "tokenizer.json",
    "tokenizer_config.json",
    "trainer_state.json",
    "training_args.bin",
    "zero_to_fp32.py",
    "zero_to_torch.py",
)
# Sizes roughly as the tiny demo model writes them (bytes); binary files get random content.
SIZES = {".pt": 40_000, ".pth": 1_500, ".safetensors": 50_000, ".bin": 7_000}


def layout(step: int, ranks: int = 2) -> list[str]:
    """The relative paths of checkpoint-`step` written by `ranks` ranks."""
    paths = []
    for name in REAL_LAYOUT:
        if "{rank}" in name:
            paths += [name.format(step=step, rank=r) for r in range(ranks)]
        else:
            paths.append(name.format(step=step))
    return paths


def _content(rel: str, step: int, seed: int) -> bytes:
    if rel == "latest":
        return f"global_step{step}".encode()
    if rel == "trainer_state.json":
        return json.dumps({"global_step": step, "log_history": [{"step": step, "loss": 1.0 / step}]}).encode()
    suffix = Path(rel).suffix
    if suffix in SIZES:
        return random.Random(f"{seed}-{step}-{rel}").randbytes(SIZES[suffix])
    return json.dumps({"file": rel, "step": step}).encode() + b"\n"


def make_checkpoint(out: Path, step: int, ranks: int = 2, complete: bool = True, seed: int = 0,
                    extra: dict[str, bytes] | None = None) -> Path:
    """OUTPUT/checkpoint-`step`; `complete=False` stops before trainer_state.json, as a save in progress."""
    folder = Path(out) / f"checkpoint-{step}"
    files = {rel: _content(rel, step, seed) for rel in layout(step, ranks)}
    files.update(extra or {})
    state = files.pop("trainer_state.json")
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    if complete:
        (folder / "trainer_state.json").write_bytes(state)
    return folder


def complete_checkpoint(folder: Path) -> None:
    """Write the trainer_state.json that marks a save finished."""
    step = int(folder.name.split("-")[1])
    (folder / "trainer_state.json").write_bytes(_content("trainer_state.json", step, 0))


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path: to compare two checkpoints byte for byte."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
