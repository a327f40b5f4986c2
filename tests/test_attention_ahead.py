"""FlashAttention-4's kernels compiled beside the ranks' start (sft/ranks/attention_ahead.py): the lock the launch
takes for that process and hands to it, the ranks' wait for it, and the rows and layers it runs. The process itself
runs only on GPUs (tests/test_gpu.py runs the job with it there); here it starts for real and fails to find CUDA."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import threading
import time

import pytest
from conftest import DEMO_MODEL, clean_environ
from test_decide import ONE_H200, decided

from sft.controller import launch
from sft.controller.output import Paths
from sft.controller.runs import make_spec
from sft.handoff import RunSpec, lock_held
from sft.planner.inputs import Ranks
from sft.ranks import attention_ahead
from sft.ranks.patches import flash_attention_4
from sft.settings import Settings

ON_GPU = Ranks(count=1, gpus=(0,))


def spec_of(tmp_path, **settings) -> RunSpec:
    s = Settings(**{"model": str(DEMO_MODEL), "output_dir": str(tmp_path / "out"), "max_length": 64, "micro_batch": 2,
                    **settings})
    d = decided(machine=dataclasses.replace(ONE_H200, flash_attention_4_installed=True), **dataclasses.asdict(s))
    return make_spec(s, d, Paths(s.output_path), "probe", s.output_path, 5)


def test_the_spec_names_the_lock_where_flash_attention_4_runs(tmp_path):
    spec = spec_of(tmp_path)
    assert spec.attention == "flash_attention_4"
    assert spec.attention_lock == str((tmp_path / "out" / "run" / "attention-kernels.lock").absolute())
    s = Settings(model=str(DEMO_MODEL), output_dir=str(tmp_path / "out"))
    flex = make_spec(s, decided(), Paths(s.output_path), "probe", s.output_path, 5)  # flash-attn-4 not installed
    assert flex.attention == "flex_attention" and flex.attention_lock == ""


def test_the_process_holds_the_lock_from_before_it_starts_until_it_ends(tmp_path, capfd):
    """The launch takes the lock, then starts the process with it: no rank can find it free before the process
    ends. Here the process fails (no CUDA on this machine), says so, and the lock is free after it."""
    spec = spec_of(tmp_path)
    path = spec.save(tmp_path / "spec.json")
    began = time.monotonic()
    process = launch.compile_ahead(spec, path, clean_environ(tmp_path), ON_GPU)
    assert process is not None and lock_held(spec.attention_lock)  # at once, before the process has imported anything
    assert attention_ahead.wait(spec.attention_lock, timeout_s=0.3) >= 0.3  # a rank gives up after its timeout
    waited = attention_ahead.wait(spec.attention_lock)
    assert process.wait(timeout=5) == 1 and waited <= time.monotonic() - began
    assert not lock_held(spec.attention_lock)
    out = capfd.readouterr().out
    assert "FlashAttention-4's kernels: compiled meanwhile on GPU 0 (sft.ranks.attention_ahead)" in out
    assert "FlashAttention-4's kernels were not compiled ahead" in out


def test_no_process_on_cpu_ranks_without_a_lock_or_where_the_lock_is_taken(tmp_path):
    spec = spec_of(tmp_path)
    path = spec.save(tmp_path / "spec.json")
    env = clean_environ(tmp_path)
    assert launch.compile_ahead(spec, path, env, Ranks(count=2, gpus=())) is None
    assert launch.compile_ahead(dataclasses.replace(spec, attention_lock=""), path, env, ON_GPU) is None
    assert launch.compile_ahead(None, path, env, ON_GPU) is None
    os.makedirs(os.path.dirname(spec.attention_lock), exist_ok=True)
    fd = os.open(spec.attention_lock, os.O_WRONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another node's process, on a shared output folder
        assert launch.compile_ahead(spec, path, env, ON_GPU) is None
    finally:
        os.close(fd)


def test_a_ranks_first_attention_call_waits_for_the_process_then_none_does(tmp_path):
    lock = str(tmp_path / "attention-kernels.lock")
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(0.5, os.close, (fd,)).start()  # the process ends half a second from now
    calls = []
    forward = flash_attention_4._after_kernels_ahead(lambda *a, **k: calls.append((a, k)) or "out", lock)
    began = time.monotonic()
    assert forward(1, key=2) == "out" and time.monotonic() - began >= 0.45
    fcntl.flock(fd2 := os.open(lock, os.O_WRONLY), fcntl.LOCK_EX)  # held again: the later calls do not look
    try:
        began = time.monotonic()
        assert forward(3) == "out" and time.monotonic() - began < 0.1
    finally:
        os.close(fd2)
    assert calls == [((1,), {"key": 2}), ((3,), {})]
    assert attention_ahead.wait(lock) < 0.1  # nobody holds it: at once


@pytest.mark.parametrize("kinds,layers", [(None, 1), (["full_attention"] * 36, 1),
                                          (["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"], 6),
                                          (["full_attention", "linear_attention", "full_attention"], 2)])
def test_one_layer_of_each_kind(kinds, layers):
    config = type("Config", (), {"layer_types": kinds})()
    assert attention_ahead.layers_of_each_kind(config) == layers


@pytest.mark.parametrize("packing", [True, False])
def test_the_rows_are_shaped_as_the_runs(tmp_path, packing):
    spec = spec_of(tmp_path, packing=packing, max_length=2048, micro_batch=3)
    rows = attention_ahead.rows(spec, vocab=500)
    assert len(rows) == 3 and all(0 <= t < 500 for row in rows for t in row["input_ids"])
    if packing:  # packed rows of two sequences, the longer at 3/4 of the row
        assert all(len(r["input_ids"]) == 2048 and r["seq_lengths"] == [1536, 512] for r in rows)
    else:  # padded rows: the longest at max_length
        assert [len(r["input_ids"]) for r in rows] == [2048, 1024, 682] and "seq_lengths" not in rows[0]
