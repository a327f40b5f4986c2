"""sft/ranks/upstream.py: the fixes of library bugs, against the libraries' own code.

What the fix is for (ZeRO-3 with checkpoints in host memory, on GPUs) is only on GPUs: an H200 run failed with
TRL's `'Tensor' object has no attribute 'ds_status'` before it and trained after it, with the losses of ZeRO-3
without offloading (docs/long-rows.md). Here: the function TRL runs, with ZeRO-3 on, given what the offload
hooks hand back (a plain tensor), before and after the fix; the CPU ZeRO-3 runs of the other tests go through
the fixed function with ZeRO-3's own parameters.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def zero3_on():
    from transformers.integrations import HfDeepSpeedConfig

    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    yield config  # transformers reads ZeRO-3 as on while this object lives (a weak reference)
    del config


@pytest.fixture
def trl_utils():
    from trl.trainer import utils

    original = utils.maybe_gather_lm_head_ctx
    yield utils
    utils.maybe_gather_lm_head_ctx = original


def test_the_fused_heads_gather_passes_a_plain_tensor_by(zero3_on, trl_utils):
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from sft.ranks import upstream

    assert is_deepspeed_zero3_enabled()
    weight = torch.ones(8, 4)  # the full weight, as the offload hooks return it to the backward
    with pytest.raises(AttributeError, match="ds_status"):
        trl_utils.maybe_gather_lm_head_ctx(weight, None)  # TRL's own: the failure seen on the H200
    upstream.fused_head_with_offloaded_checkpoints()
    upstream.fused_head_with_offloaded_checkpoints()  # twice (a second trainer in one process) wraps once
    assert trl_utils.maybe_gather_lm_head_ctx.__wrapped__.__module__ == "trl.trainer.utils"
    with trl_utils.maybe_gather_lm_head_ctx(weight, None):
        assert weight.shape == (8, 4)
    with pytest.raises(RuntimeError, match="saved weight is empty"):
        trl_utils.maybe_gather_lm_head_ctx(torch.empty(0), None)  # freed: a wrong gradient, so it fails
