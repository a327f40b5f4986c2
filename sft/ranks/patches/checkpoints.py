"""How DeepSpeed's checkpoint engine writes its files: torch.save without a CRC32 of each record, and each GPU storage
copied through a small pinned ring (saving.py); ZeRO-1/2's weights written from where they are, not copied whole into
host memory first; each until its library changes (its "Remove when")."""

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


def weights_saved_where_they_are() -> None:
    """ZeRO-1/2's bf16 weights go into a checkpoint from where they live, instead of being copied whole into new
    pageable host memory in the save, twice: DeepSpeed clones its module state to the host before its engine writes
    it (`preserves_storage_sharing`), and accelerate's `get_state_dict` clones the weights the Trainer's
    model.safetensors gets. Each clone is a synchronous copy of every weight that held the steps in every save
    (docs/benchmarks.md, "checkpoints written in the background"); the writers here copy them out themselves,
    through pinned memory on a stream of their own (saving.py, background.py, weights.py).

    The clones exist because the weights are views into DeepSpeed's flat buffers. DeepSpeed's engine here
    (by records, zip format) writes each flat buffer once, whole: the weights and a few elements of padding. The
    Trainer's weights are given a storage of their own bytes (the same memory), so that transformers' tied-weight
    check and the Hub's shard split, which compare storages, see one tensor per weight again. Remove when
    DeepSpeed and accelerate copy no weights to the host before a save."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    if getattr(Accelerator.get_state_dict, "where_they_are", False):
        return
    TorchCheckpointEngine.preserves_storage_sharing = lambda self: not self.zipfile_serialization
    original = Accelerator.get_state_dict

    @functools.wraps(original)
    def get_state_dict(self, model, unwrap=True):
        config = self.deepspeed_config if self.distributed_type == DistributedType.DEEPSPEED else None
        if (config is None or config["zero_optimization"]["stage"] == 3
                or config.get("tensor_parallel", {}).get("autotp_size", 0) > 1):
            return original(self, model, unwrap)
        return {name: _alone(tensor) for name, tensor in self.unwrap_model(model).state_dict().items()}

    get_state_dict.where_they_are = True
    Accelerator.get_state_dict = get_state_dict


def _alone(tensor):
    """`tensor` over a storage of its own bytes: the same memory, no copy (a tensor that is not contiguous is
    copied where it is)."""
    import torch

    if not tensor.is_contiguous():
        return tensor.contiguous()
    start = tensor.storage_offset() * tensor.element_size()
    own = tensor.untyped_storage()[start:start + tensor.numel() * tensor.element_size()]
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(own, 0, tensor.shape, tensor.stride())
