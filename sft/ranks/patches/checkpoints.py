"""How DeepSpeed's checkpoint engine writes its files: torch.save without a CRC32 of each record, and each GPU storage
copied through a small pinned ring (saving.py); each until torch changes (its "Remove when")."""

from __future__ import annotations

import functools
from pathlib import Path


def checkpoints_without_crc32() -> None:
    """torch.save, as DeepSpeed's checkpoint engine calls it, without a CRC32 of each record (torch's own switch,
    torch.utils.serialization.config.save.compute_crc32, on by default for zip tools). A Qwen3-4B checkpoint (ZeRO-2's
    fp32 weights and Adam state, the bf16 weights) took as long to write to a tmpfs as 200 of its steps (measured:
    docs/speed.md, 'where a one-epoch run's time goes'), and the checksum is one more pass over every byte on one core.
    torch.load reads such files as before (it does not check the CRC); `unzip -t` calls them corrupt. The Hub upload
    hashes each file itself. Remove it if torch turns the checksum off by default."""
    from torch.utils.serialization import config

    config.save.compute_crc32 = False


def checkpoints_by_records(background: bool = False, reserve_bytes: int = 0) -> None:
    """DeepSpeed's checkpoint engine writes its files through `saving.save` (the same file torch.save writes,
    each GPU storage copied through a small pinned ring into its record) instead of torch.save, which copies
    each GPU storage whole into new pageable memory, slower than the write itself (saving.py says why and what it
    gave). Only the zip format, DeepSpeed's default; its legacy format goes to torch.save as before. Remove
    when torch.save copies GPU storages through bounded pinned memory itself. With `background`, the files are
    written while the steps go on (background.py says why by hand), their memory (`reserve_bytes`) taken ahead."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from . import background as written_later
    from . import saving

    if background:
        written_later.start(reserve_bytes)
    original = TorchCheckpointEngine.save
    if getattr(original, "by_records", False):
        return

    @functools.wraps(original)
    def save(self, state_dict, path: str):
        if not self.zipfile_serialization:
            return original(self, state_dict, path)
        saving.save(state_dict, path, written_later.writer())

    save.by_records = True
    TorchCheckpointEngine.save = save


def rotation_keeps_a_complete_one() -> None:
    """The Trainer's rotation (transformers' rotate_checkpoints) counts a checkpoint still being written as one it
    keeps, and with SFT_SAVE_TOTAL_LIMIT=1 would delete the only complete one while the newest is written: a kill then
    left nothing to resume from. Here a newest checkpoint that is not complete yet does not count. Remove when
    transformers' rotation knows of checkpoints written after the save returns."""
    import transformers.trainer

    from ...checkpoints import all_checkpoints, problem

    original = transformers.trainer.rotate_checkpoints
    if getattr(original, "keeps_a_complete_one", False):
        return

    @functools.wraps(original)
    def rotate(output_dir, save_total_limit=None, *args, **kwargs):
        found = all_checkpoints(Path(output_dir))
        if save_total_limit and found and problem(found[-1]) is not None:
            save_total_limit += 1  # the newest is being written: the one before it is what a resume needs
        return original(output_dir, save_total_limit, *args, **kwargs)

    rotate.keeps_a_complete_one = True
    transformers.trainer.rotate_checkpoints = rotate


def checkpoint_weights_in_background() -> None:
    """transformers' save_pretrained writes a checkpoint's model.safetensors through weights.py, in the background
    beside DeepSpeed's files; the final model (final/) as before. Remove when safetensors writes without holding
    the GIL from bounded pinned memory (weights.py says why)."""
    import transformers.modeling_utils

    from ...checkpoints import CHECKPOINT
    from . import background as written_later
    from . import weights

    original = transformers.modeling_utils.safe_save_file
    if getattr(original, "in_background", False):
        return

    @functools.wraps(original)
    def save_file(tensors, filename, metadata=None):
        writer = written_later.writer()
        if writer is None or not CHECKPOINT.match(Path(filename).parent.name):
            return original(tensors, filename, metadata=metadata)
        weights.save_file(tensors, str(filename), metadata, writer)

    save_file.in_background = True
    transformers.modeling_utils.safe_save_file = save_file
