"""Which checkpoints in the output folder are complete, which one a new start resumes from, and what they take on
its disk."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .console import say
from .handoff import CheckpointRecord, read_json

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# A file written in the background is in a folder beside its place until whole, WRITING-RANK (ranks/patches/
# background.py): the same name, so torch.save's file is the same byte for byte (it names its records after the file)
WRITING = ".sft-writing"
# A checkpoint the rotation retires (`retire`) is renamed REMOVING-checkpoint-N at once, so that no resume, upload or
# listing sees half of it, and its files are removed behind the steps (ranks/patches/background.py)
REMOVING = ".sft-removing"
SHARD = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def step_of(path: Path) -> int:
    return int(CHECKPOINT.match(path.name).group(1))


def all_checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)]
    return sorted(found, key=step_of)


def recorded(checkpoint: Path) -> CheckpointRecord | None:
    """How the job that wrote the checkpoint made it (rank 0 writes it before the Trainer saves)."""
    return CheckpointRecord.load(checkpoint / CheckpointRecord.FILE)


def shard_ranks(checkpoint: Path) -> list[int]:
    """The ranks whose ZeRO optimizer shards the checkpoint holds."""
    latest = checkpoint / "latest"
    if not latest.is_file():
        return []
    tag_dir = checkpoint / latest.read_text().strip()
    if not tag_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in tag_dir.iterdir() if (m := SHARD.match(p.name)))


def problem(checkpoint: Path) -> str | None:
    """Why a checkpoint is not complete, or None if the Trainer and DeepSpeed finished writing it.

    The Trainer writes trainer_state.json after DeepSpeed's save (which ends in a barrier across
    ranks), so its presence with `latest` and every rank's shard means nothing is half-written; where the
    files are written in the background, none may still be in a WRITING folder.
    """
    if not (checkpoint / "trainer_state.json").is_file():
        return "no trainer_state.json"
    try:
        writing = sorted(p.name for p in checkpoint.rglob(f"{WRITING}-*/*"))
    except FileNotFoundError:  # a writer moved its folder into place, or rotation removed the checkpoint, meanwhile
        return "changed while looked at"
    if writing:  # its files are written while the steps go on: complete once moved to their place
        return f"still being written ({', '.join(writing)})"
    if read_json(checkpoint / "trainer_state.json") is None:  # the Trainer writes it in place: a full disk tears it
        return "trainer_state.json is torn"
    ranks = shard_ranks(checkpoint)
    if not ranks:
        return "no DeepSpeed state (`latest` or its shards missing)"
    if ranks != list(range(len(ranks))):
        return f"shards of ranks {ranks}: some rank's shard is missing"
    # on several nodes the last ranks' shards come from another machine: count them against the record
    record = recorded(checkpoint)
    world = record.world_size if record else len(ranks)
    if len(ranks) != world:
        return f"shards of {len(ranks)} of the {world} ranks that wrote it"
    return None


def complete(output_dir: Path) -> list[Path]:
    """The complete checkpoints, oldest first."""
    return [c for c in all_checkpoints(output_dir) if problem(c) is None]


def latest_complete(output_dir: Path) -> Path | None:
    """The newest complete checkpoint, warning about newer torn ones it skips."""
    for checkpoint in reversed(all_checkpoints(output_dir)):
        why = problem(checkpoint)
        if why is None:
            return checkpoint
        say(f"warning: skipping {checkpoint.name}: incomplete ({why})")
    return None


def torn(output_dir: Path) -> list[Path]:
    """The incomplete checkpoints newer than the newest complete one: what a failed or killed save leaves."""
    found = []
    for checkpoint in reversed(all_checkpoints(output_dir)):
        if problem(checkpoint) is None:
            break
        found.append(checkpoint)
    return found


def retire(output_dir: Path, keep: int, protected: str | None = None) -> list[Path]:
    """Rename every checkpoint older than the newest `keep` complete ones (but `protected`: the Trainer's best) to
    REMOVING-<name>, and return the renamed folders, to be removed. By hand, not transformers' rotate_checkpoints:
    that removes them in the calling thread, and removing a checkpoint of tens of GB held the steps for seconds
    (4.5 s for Qwen3-1.7B's 27.5 GB on an H100 machine's disk)."""
    found = all_checkpoints(output_dir)
    whole = [c for c in found if problem(c) is None]
    if keep <= 0 or len(whole) <= keep:
        return []
    oldest_kept = step_of(whole[-keep])
    keep_too = Path(protected).resolve() if protected else None
    retired = []
    for checkpoint in found:
        if step_of(checkpoint) < oldest_kept and checkpoint.resolve() != keep_too:
            retired.append(checkpoint.rename(output_dir / f"{REMOVING}-{checkpoint.name}"))
    return retired


def being_removed(output_dir: Path) -> list[Path]:
    """The retired checkpoints whose removal has not finished (or was cut off by a kill)."""
    return sorted(output_dir.glob(f"{REMOVING}-*")) if output_dir.is_dir() else []


def freed_by_removal(output_dir: Path) -> int:
    """Bytes the retired checkpoints' removal gives back: the blocks of their files with no other link (the
    uploader's hard-linked snapshot of one it is sending keeps that file's blocks until it is sent)."""
    return sum(folder_bytes(folder, unlinked_only=True) for folder in being_removed(output_dir))


def remove_retired(output_dir: Path) -> None:
    """Remove the retired checkpoints a kill or a failure left before their removal ended."""
    for folder in being_removed(output_dir):
        shutil.rmtree(folder, ignore_errors=True)


def free_disk(output_dir: str) -> int:
    """Free bytes on the filesystem that will hold output_dir (its nearest existing parent)."""
    path = Path(output_dir).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def free_after_writes(output_dir: Path, newest: Path) -> int:
    """Free bytes once the newest checkpoint's background write and the retired ones' removal have ended: free now,
    less what is still to be written, plus what is still to be removed."""
    coming = unwritten_bytes(newest)
    return free_disk(str(output_dir)) - coming + freed_by_removal(output_dir)


def unwritten_bytes(path: Path) -> int:
    """Bytes the folder's files still being written in the background will take: each is its final size already
    (torch.save's file with its records left as holes) but holds only the blocks written so far."""
    total = 0
    for found in path.rglob(f"{WRITING}-*/*"):
        try:
            st = found.stat()
        except FileNotFoundError:
            continue  # renamed or removed while counted: written
        total += max(st.st_size - st.st_blocks * 512, 0)
    return total


def folder_bytes(path: Path, unlinked_only: bool = False) -> int:
    """Bytes a folder takes on its disk (allocated blocks, as du counts them), its subfolders included; with
    unlinked_only, of the files no other hard link holds (what removing the folder gives back)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue  # removed while counted (the Trainer rotating checkpoints)
            if not unlinked_only or st.st_nlink == 1:
                total += st.st_blocks * 512
    return total
