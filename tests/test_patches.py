"""sft/ranks/patches/: the fixes of library bugs, against the libraries' own code.

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

    from sft.ranks.patches import checkpoints, trl_head

    assert is_deepspeed_zero3_enabled()
    weight = torch.ones(8, 4)  # the full weight, as the offload hooks return it to the backward
    with pytest.raises(AttributeError, match="ds_status"):
        trl_utils.maybe_gather_lm_head_ctx(weight, None)  # TRL's own: the failure seen on the H200
    trl_head.fused_head_with_offloaded_checkpoints()
    trl_head.fused_head_with_offloaded_checkpoints()  # twice (a second trainer in one process) wraps once
    assert trl_utils.maybe_gather_lm_head_ctx.__wrapped__.__module__ == "trl.trainer.utils"
    with trl_utils.maybe_gather_lm_head_ctx(weight, None):
        assert weight.shape == (8, 4)
    with pytest.raises(RuntimeError, match="saved weight is empty"):
        trl_utils.maybe_gather_lm_head_ctx(torch.empty(0), None)  # freed: a wrong gradient, so it fails


@pytest.mark.parametrize("world", [1, 2])
def test_the_gradient_norm_in_fp32_is_deepspeeds(world, tmp_path):
    """The job's ZeRO-1/2 gradient norm (torch's foreach norm in fp32, for the speed of an H200's step) against
    DeepSpeed's own (fp64, one parameter at a time) on the same three clipped steps from the same weights,
    through real DeepSpeed ZeRO-2 in bf16 on 1 and 2 CPU ranks (a parameter split between the ranks, padded
    partitions): the same norms, so the same clipping and the same weights after; a NaN gradient reads as
    DeepSpeed's does (inf, which the ranks stop on: tests/test_diverged.py)."""
    import json
    import subprocess
    import sys

    from conftest import REPO, clean_environ
    from sft.nodes import free_port

    port, logs = free_port(), [tmp_path / f"rank{r}.log" for r in range(world)]
    # each rank's output to a file: a pipe not read while the test waits on another rank could fill and block it
    ranks = []
    for r, log in enumerate(logs):
        with log.open("w") as out:  # the child keeps its own copy of the file
            ranks.append(subprocess.Popen([sys.executable, "-m", "tests.gradient_norm_step", str(port), str(r),
                                           str(world)], env=clean_environ(tmp_path), cwd=REPO, stdout=out,
                                          stderr=subprocess.STDOUT))
    for r, log in zip(ranks, logs):
        assert r.wait(timeout=600) == 0, log.read_text()[-6000:]
    result = json.loads(next(line for line in reversed(logs[0].read_text().splitlines())
                             if line.startswith('{"deepspeed"')))
    assert all(n > 0.5 * 4 for n in result["deepspeed"])  # clipped, each step
    assert result["job"] == pytest.approx(result["deepspeed"], rel=1e-5)
    assert result["deepspeed"][1] != pytest.approx(result["deepspeed"][0], rel=1e-3)  # steps differ
    assert result["job_nan"] == result["deepspeed_nan"] == [float("inf")]  # what the ranks stop on


@pytest.mark.parametrize("world,fused,stage", [(1, "plain", "2"), (2, "fused", "2"), (2, "fused", "1"), (1, "bnb8", "2"),
                                               (2, "bnb8", "2")])
def test_the_zero_step_in_one_pass_is_deepspeeds(world, fused, stage, tmp_path):
    """The job's ZeRO-1/2 step (torch's AdamW from the bf16 gradients, clipped, in one pass: sft/ranks/patches/adamw.py)
    against DeepSpeed's own on the same four clipped steps from the same weights, through real DeepSpeed ZeRO-2
    (and ZeRO-1) in bf16 on 1 and 2 CPU ranks (a parameter split between the ranks, padded partitions), two
    parameter groups (weight decay and none), a learning rate that changes each step, torch's AdamW fused and
    not, and bitsandbytes' 8-bit AdamW (sft/ranks/patches/adamw8bit.py; on one rank the decayed group's state is 8-bit,
    on two each rank's partition is under bitsandbytes' min_8bit_size and keeps 32-bit moments): the same
    norms, the same Adam moments, the master weights within float32's rounding, the same bf16 weights; and a
    checkpoint the job's step saved loads into DeepSpeed's own and steps as the job's engine does."""
    import json
    import subprocess
    import sys

    from conftest import REPO, clean_environ
    from sft.nodes import free_port

    port, logs = free_port(), [tmp_path / f"rank{r}.log" for r in range(world)]
    ranks = []
    for r, log in enumerate(logs):  # each rank's output to a file, as in the test above
        with log.open("w") as out:
            ranks.append(subprocess.Popen([sys.executable, "-m", "tests.optimizer_step", str(port), str(r), str(world),
                                           fused, str(tmp_path / "checkpoint"), stage], env=clean_environ(tmp_path),
                                          cwd=REPO, stdout=out, stderr=subprocess.STDOUT))
    for r, log in zip(ranks, logs):
        assert r.wait(timeout=600) == 0, log.read_text()[-6000:]
    result = json.loads(next(line for line in reversed(logs[0].read_text().splitlines())
                             if line.startswith('{"deepspeed"')))
    assert result["calls"] == 5 * 2  # the job's step served both groups at every step
    for deepspeeds, jobs in [*zip(result["deepspeed"], result["job"]), (result["after_loaded"][0],
                                                                        result["after_job"][0])]:
        assert jobs["norm"] == deepspeeds["norm"] > 0.5 and jobs["step"] == deepspeeds["step"]
        moments = ("state1", "state2") if fused == "bnb8" else ("exp_avg", "exp_avg_sq")
        for key in ("master", *moments, "weights"):
            for mine, theirs in zip(jobs[key], deepspeeds[key]):
                assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-8), key  # an update of ~1e-2: 1e-6 of it
    if fused == "bnb8":
        assert result["job"][0]["eight_bit"] == ([True, False] if world == 1 else [False, False])
    moved = [abs(a - b) for a, b in zip(result["job"][3]["master"][0], result["job"][0]["master"][0])]
    assert max(moved) > 1e-3  # the steps changed the weights: the comparison above is not of still weights


def test_checkpoints_without_crc32_load_as_before(tmp_path):
    """The switch is torch's: records written without their CRC32 (the zip's field is 0), read back the same by
    torch.load, as a resume reads DeepSpeed's files (the job tests resume from such checkpoints on CPU ranks)."""
    import zipfile

    from sft.ranks.patches import checkpoints, trl_head
    from torch.utils.serialization import config

    state = {"fp32": torch.randn(1000, 64), "step": 7, "nested": {"exp_avg": torch.randn(3, 5)}}
    torch.save(state, tmp_path / "with.pt")
    try:
        checkpoints.checkpoints_without_crc32()
        torch.save(state, tmp_path / "without.pt")
    finally:
        config.save.compute_crc32 = True
    crcs = {name: [i.CRC for i in zipfile.ZipFile(tmp_path / name).infolist() if i.file_size]
            for name in ("with.pt", "without.pt")}
    assert all(crcs["with.pt"]) and not any(crcs["without.pt"])
    loaded = torch.load(tmp_path / "without.pt", weights_only=False)
    assert loaded["step"] == 7 and torch.equal(loaded["fp32"], state["fp32"])
    assert torch.equal(loaded["nested"]["exp_avg"], state["nested"]["exp_avg"])
