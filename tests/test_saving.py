"""sft/ranks/patches/saving.py: a checkpoint file written by records is torch.save's file, byte for byte.

Here on the host (the records written from host memory, as CPU ranks save); the GPU's pinned ring is tested
in tests/test_gpu.py. The jobs of the other tests save and resume their DeepSpeed checkpoints through it.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from sft.ranks.patches import saving


class Holder:  # an object pytree cannot see into: its tensor is still a record
    def __init__(self, tensor):
        self.tensor, self.count = tensor, 3


@dataclasses.dataclass
class Fragment:
    tensor: torch.Tensor
    start: int = 7


def state() -> dict:
    flat = torch.randn(21_000_000)  # 84 MB: two chunks of the writer
    return {"flat": flat, "view": flat[5:100], "again": flat, "bf16": torch.randn(300, 700).bfloat16(),
            "long": torch.arange(100_000), "empty": torch.empty(0), "holder": Holder(torch.ones(5)),
            "fragment": Fragment(torch.full((4,), 2.0)), "transposed": torch.randn(50, 60).t(),
            "nested": collections.OrderedDict(z=torch.zeros(3), y=[torch.tensor(1.5), 4, "text", None])}


def test_the_file_is_torch_saves_byte_for_byte(tmp_path, crc32_off):
    obj = state()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()  # the same name: torch.save writes it into the file
    assert saving.save(obj, tmp_path / "a" / "states.pt") is True  # by records, not torch.save's fallback
    torch.save(obj, tmp_path / "b" / "states.pt")
    written, expected = (tmp_path / "a" / "states.pt").read_bytes(), (tmp_path / "b" / "states.pt").read_bytes()
    assert len(written) == len(expected) and written == expected


def test_with_crc32_on_it_loads_as_saved(tmp_path):
    obj = state()
    assert saving.save(obj, tmp_path / "states.pt") is True
    back = torch.load(tmp_path / "states.pt", weights_only=False)
    assert torch.equal(back["flat"], obj["flat"]) and torch.equal(back["bf16"], obj["bf16"])
    assert back["view"].untyped_storage().data_ptr() == back["flat"].untyped_storage().data_ptr()  # shared
    assert torch.equal(back["holder"].tensor, torch.ones(5)) and back["fragment"].start == 7
    assert back["transposed"].stride() == (1, 60) and torch.equal(back["transposed"], obj["transposed"])
    assert back["nested"]["y"][1:] == [4, "text", None] and back["empty"].numel() == 0


def test_what_skip_data_refuses_is_written_by_torch_save(tmp_path):
    obj = {"nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "host": torch.arange(4)}
    assert saving.save(obj, tmp_path / "states.pt") is False
    back = torch.load(tmp_path / "states.pt", weights_only=False)
    assert back["nested"].is_nested and torch.equal(back["host"], torch.arange(4))


def test_deepspeeds_checkpoint_engine_writes_through_it(tmp_path, crc32_off, monkeypatch):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from sft.ranks.patches import checkpoints

    checkpoints.checkpoints_by_records()
    checkpoints.checkpoints_by_records()  # once only, however often the rank calls it
    calls = []
    real = saving.save
    monkeypatch.setattr(saving, "save", lambda obj, path, writer=None: calls.append(path) or real(obj, path, writer))
    engine = TorchCheckpointEngine()
    engine.zipfile_serialization = True  # DeepSpeed's default where a config is given
    obj = state()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    engine.save(obj, str(tmp_path / "a" / "optim.pt"))
    torch.save(obj, tmp_path / "b" / "optim.pt")
    assert calls == [str(tmp_path / "a" / "optim.pt")]
    assert (tmp_path / "a" / "optim.pt").read_bytes() == (tmp_path / "b" / "optim.pt").read_bytes()
    engine.zipfile_serialization = False  # its legacy format: torch.save as before
    engine.save(obj, str(tmp_path / "a" / "legacy.pt"))
    assert len(calls) == 1 and torch.equal(torch.load(tmp_path / "a" / "legacy.pt", weights_only=False)["long"],
                                           obj["long"])
