"""The Trainer's model.safetensors in a checkpoint, written while the steps go on as DeepSpeed's files are
(background.py): its tensors copied out in the save, the file written behind it.

Why by hand: safetensors' save_file copies every tensor into pageable memory and writes it holding the GIL (as
transformers' save_pretrained says beside its call), so it can neither be quick in the save nor run beside the
training's thread. The format is small and fixed (https://huggingface.co/docs/safetensors: a little-endian u64
header length, a JSON header of each tensor's dtype, shape and byte range, padded with spaces to 8 bytes, then the
bytes); safetensors reads the file back (tests/test_background_save.py).
"""

from __future__ import annotations

import json
import struct

import torch


DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def header(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> tuple[bytes, list[int]]:
    """The file's first bytes (length and JSON header) and each tensor's offset in the file, in `tensors`' order."""
    entries, offsets, at = {}, [], 0
    if metadata:
        entries["__metadata__"] = metadata
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        entries[name] = {"dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [at, at + size]}
        offsets.append(at)
        at += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    return struct.pack("<Q", len(text)) + text, [start + o for o in offsets]


def save_file(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str] | None, writer) -> None:
    """`filename` as safetensors writes it, its tensors copied out now and written by `writer` later."""
    tensors = {name: t.contiguous() for name, t in tensors.items()}
    first, offsets = header(tensors, metadata)
    skeleton = writer.skeleton(filename)
    with open(skeleton, "wb") as f:
        f.write(first)
        f.truncate(offsets[-1] + _nbytes(list(tensors.values())[-1]) if tensors else len(first))
    sources = [t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
               for t in tensors.values()]
    writer.snapshot(sources, offsets, skeleton, filename)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
