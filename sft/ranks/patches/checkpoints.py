"""How DeepSpeed's checkpoint engine writes its files: torch.save without a CRC32 of each record, and each GPU storage
copied through a small pinned ring (saving.py); each until torch changes (its "Remove when")."""

from __future__ import annotations

import functools


def checkpoints_without_crc32() -> None:
    """torch.save, as DeepSpeed's checkpoint engine calls it, without a CRC32 of each record (torch's own switch,
    torch.utils.serialization.config.save.compute_crc32, on by default for zip tools). A Qwen3-4B checkpoint (ZeRO-2's
    fp32 weights and Adam state, the bf16 weights) took as long to write to a tmpfs as 200 of its steps (measured:
    docs/speed.md, 'where a one-epoch run's time goes'), and the checksum is one more pass over every byte on one core.
    torch.load reads such files as before (it does not check the CRC); `unzip -t` calls them corrupt. The Hub upload
    hashes each file itself. Remove it if torch turns the checksum off by default."""
    from torch.utils.serialization import config

    config.save.compute_crc32 = False


def checkpoints_by_records() -> None:
    """DeepSpeed's checkpoint engine writes its files through `saving.save` (the same file torch.save writes,
    each GPU storage copied through a small pinned ring into its record) instead of torch.save, which copies
    each GPU storage whole into new pageable memory, slower than the write itself (saving.py says why and what it
    gave). Only the zip format, DeepSpeed's default; its legacy format goes to torch.save as before. Remove
    when torch.save copies GPU storages through bounded pinned memory itself."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from . import saving

    original = TorchCheckpointEngine.save
    if getattr(original, "by_records", False):
        return

    @functools.wraps(original)
    def save(self, state_dict, path: str):
        if not self.zipfile_serialization:
            return original(self, state_dict, path)
        saving.save(state_dict, path)

    save.by_records = True
    TorchCheckpointEngine.save = save
