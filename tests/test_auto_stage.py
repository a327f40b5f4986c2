"""The stage the job picks by itself: the planner's choice through the CLI, and the probe's
escalation when a stage runs out of memory (the real OOM error, raised in the probe rank)."""

from __future__ import annotations

import json

import pytest
from transformers import Qwen3Config

from conftest import clean_environ, demo_env, read_summary, run_entrypoint

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)


@pytest.mark.parametrize("memory,choice", [("79.25", "2"), ("44.4", "3")])
def test_plan_command_gives_the_seeds_advice(tmp_path, memory, choice):
    """The seed: ZeRO-2 for Qwen3-8B on 8 x 80 GB, ZeRO-3 on 8 x 48 GB. The job's one-pass step at ZeRO-2 makes no
    fp32 gradients (3.81 GiB a GPU less than DeepSpeed's estimate), but with checkpointing its flattened 16-bit
    gradients come on top of the backward (planner/memory.py, ONE_PASS_STEP_BYTES), so 48 GB is ZeRO-3's again; the
    model states printed are still DeepSpeed's own estimator's."""
    Qwen3Config(**QWEN3_8B).save_pretrained(tmp_path / "qwen3-8b")
    result = run_entrypoint(clean_environ(tmp_path), "plan", "--model", str(tmp_path / "qwen3-8b"), "--gpus", "8",
                            "--gpu-memory", memory, "--host-memory", "1000", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert plan["decision"]["stage"] == choice
    states = {o["option"]: o["model_states"] for o in plan["options"]}
    assert (states["2"], states["3"]) == (32.42, 19.48)  # DeepSpeed's own estimator, as the seed prints it
    assert {o["option"]: o["states_not_made"] for o in plan["options"]}["2"] == 3.81


def test_plan_without_a_gpu_asks_for_the_card(tmp_path):
    result = run_entrypoint(clean_environ(tmp_path), "plan", "--model", "demo/tiny-qwen3")
    assert result.returncode == 2 and "give --gpus N and --gpu-memory GIB" in result.stderr


def test_plan_names_a_model_option_that_names_no_model(tmp_path):
    """Checked as SFT_MODEL is; before, '/nope' was read as a Hub name and refused with the Hub's rule for names."""
    result = run_entrypoint(clean_environ(tmp_path), "plan", "--model", str(tmp_path / "nope"), "--gpus", "1",
                            "--gpu-memory", "80")
    assert result.returncode == 2 and f"--model={str(tmp_path / 'nope')!r}: no such file or folder" in result.stderr


@pytest.mark.parametrize("option, value, expected", [("--gpus", "0", "x>=1"), ("--gpu-memory", "-5", "x>0"),
                                                     ("--nodes", "0", "x>=1"), ("--micro-batch", "0", "x>=1"),
                                                     ("--max-length", "-1", "x>=8"), ("--host-memory", "0", "x>0")])
def test_plan_refuses_a_count_or_a_size_below_one_naming_the_option(tmp_path, option, value, expected):
    """Before: a ZeroDivisionError's or a ValueError's traceback (exit 1), or a plan for 0 GPUs."""
    given = {"--gpus": "2", "--gpu-memory": "80", option: value}
    result = run_entrypoint(clean_environ(tmp_path), "plan", "--model", "demo/tiny-qwen3",
                            *[part for pair in given.items() for part in pair])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"Invalid value for '{option}': {float(value) if 'memory' in option else value} is not in the range " \
           f"{expected}" in result.stderr


def test_plan_where_nothing_fits_says_so_and_exits_3_as_run_and_config_do(tmp_path):
    """Before: "1 x 0.000999999 GiB" (the GiB given, truncated to bytes), and exit 0 with the refusal at the end of
    the decisions' text, as if a plan had been found."""
    args = ("plan", "--model", "demo/tiny-qwen3", "--gpus", "1", "--gpu-memory", "0.001", "--host-memory", "64")
    result = run_entrypoint(clean_environ(tmp_path), *args)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "0.000999" not in result.stdout + result.stderr
    assert "1 node(s) x 1 GPU(s) of 0.001 GiB" in result.stdout
    assert result.stdout.endswith("decided:\n  none: no ZeRO option fits this machine (why: below)\n")
    assert result.stderr.startswith("error: no ZeRO option fits this machine: nothing fits on 1 x 0.001 GiB with 64 "
                                    "GiB of host RAM: ZeRO-1: too big for the GPU")
    assert "it would need 1 GPU(s) of at least" in result.stderr
    shown = run_entrypoint(clean_environ(tmp_path), *args, "--json")
    assert shown.returncode == 3 and json.loads(shown.stdout)["decision"] is None
    assert json.loads(shown.stdout)["refused"].startswith("no ZeRO option fits this machine")


@pytest.mark.slow
def test_auto_moves_to_the_next_stage_when_the_probe_runs_out_of_memory(tmp_path):
    env = demo_env(tmp_path, probe_steps=3, max_steps=4, save_steps=4)
    env["SFTTEST_OOM_STAGES"] = "2"
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:]
    # auto checkpointing went off (the plan fits without it): first it goes back on, then the stage moves
    assert "turning gradient checkpointing on and probing again" in result.stdout
    assert "moving to ZeRO 3 and probing again" in result.stdout
    summary = read_summary(tmp_path / "out")
    assert summary["settings"]["zero_stage"] == "auto" and summary["stage"] == "3"
    assert [(e["from"], e["to"]) for e in summary["escalations"]] == [("checkpointing off", "on"), ("2", "3")]
    assert summary["resolved"]["gradient_checkpointing"] is True
    assert summary["probe"]["stage"] == "3" and summary["status"] == "done"


@pytest.mark.slow
def test_an_explicit_stage_is_obeyed_and_the_error_names_the_next(tmp_path):
    env = demo_env(tmp_path, zero_stage="2", probe_steps=3, max_steps=4)
    env["SFTTEST_OOM_STAGES"] = "2"
    result = run_entrypoint(env)
    assert result.returncode == 4, result.stdout[-3000:]
    assert "ran out of GPU memory with ZeRO 2; try SFT_ZERO_STAGE=3" in result.stdout
    assert read_summary(tmp_path / "out")["status"] == "probe failed"
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_doctor_reports_every_check(tmp_path):
    env = clean_environ(tmp_path)
    env["SFT_OUTPUT_DIR"] = str(tmp_path / "out")
    result = run_entrypoint(env, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    for name in ("driver", "gpus", "nvcc", "cpu_adam", "build_locks", "memlock", "shm", "host_memory", "disk", "topology",
                 "allreduce"):
        assert f"] {name}" in result.stdout
