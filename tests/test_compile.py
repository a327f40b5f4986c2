"""SFT_COMPILE=true through the real job on a CPU rank: each decoder layer compiled by accelerate's regional
compilation (sft/ranks/train.py), the same losses as uncompiled, and inductor's kernels in the output folder,
where a resumed job finds them (sft/controller/launch.py). On GPUs auto compiles (tests/test_decide.py); the
speed is docs/speed.md's, measured on H200s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import demo_env, read_summary, run_entrypoint

PROBE = dict(cpu_ranks=1, max_length=128, micro_batch=1, grad_accum=1, probe_steps=3)


def probe_losses(out: Path) -> list[float]:
    report = json.loads((out / "run" / "reports" / "probe-rank0.json").read_text())
    return [h["loss"] for h in report["log_history"] if "loss" in h]


@pytest.mark.timeout(900)
def test_compiled_layers_train_as_uncompiled_and_cache_their_kernels_in_the_output(tmp_path):
    runs = {}
    for compiled in ("true", "false"):
        env = demo_env(tmp_path / compiled, compile=compiled, **PROBE)
        done = run_entrypoint(env, "probe")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = Path(env["SFT_OUTPUT_DIR"])
        assert read_summary(out)["resolved"]["compile"] is (compiled == "true")
        runs[compiled] = out
    compiled, plain = probe_losses(runs["true"]), probe_losses(runs["false"])
    assert len(compiled) == len(plain) == 3 and compiled == pytest.approx(plain, abs=1e-4)
    # inductor's own generated code, not an empty folder: the layers were compiled, and cached for a resume
    kernels = list((runs["true"] / "run" / "compile-cache" / "inductor").rglob("*.py"))
    assert kernels, "no compiled kernel in OUTPUT/run/compile-cache/inductor"
    assert not list((runs["false"] / "run" / "compile-cache").rglob("*.py"))
