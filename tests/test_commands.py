"""Every subcommand as a user runs it: with no SFT_ variable at all (the image's defaults), and with a
DeepSpeed file of their own (the seed guide's ds_zero3_offload.json). Each ends with its answer or one
clear line, never a traceback. The default model, Qwen/Qwen3-8B, is its real config.json placed in the
Hugging Face cache, as a machine that had read it once holds it: no network here; so are a tokenizer
for it (the demo's, standing in) and the default dataset trl-lib/Capybara (conversations like the
demo's, loaded once from the local Hub server)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import Qwen3Config

from conftest import DEMO_DATA, DEMO_MODEL, REPO, clean_environ, read_summary
from data_fixtures import cache_hub_dataset, rows

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
SEED_OFFLOAD = {
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto",
                          "stage3_gather_16bit_weights_on_model_save": True,
                          "offload_optimizer": {"device": "cpu", "pin_memory": True}},
    "gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto"}


def cached_default_model(hf_home: Path) -> None:
    """Qwen/Qwen3-8B's config.json in the Hub cache layout huggingface_hub reads offline."""
    repo = hf_home / "hub" / "models--Qwen--Qwen3-8B"
    commit = "0" * 40
    Qwen3Config(**QWEN3_8B).save_pretrained(repo / "snapshots" / commit)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # the data step reads them
        (repo / "snapshots" / commit / name).write_bytes((DEMO_MODEL / name).read_bytes())
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


@pytest.fixture
def no_settings(tmp_path) -> tuple[dict[str, str], Path]:
    """No SFT_ variable at all; the default model cached; a working folder for the default output/."""
    env = clean_environ(tmp_path)
    cached_default_model(Path(env["HF_HOME"]))
    cache_hub_dataset(Path(env["HF_HOME"]), "trl-lib/Capybara", rows("messages", 300))
    work = tmp_path / "work"
    work.mkdir()
    return env, work


def entrypoint(env: dict[str, str], cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "entrypoint.py"), *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def one_clear_line(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stdout[-2000:] + result.stderr[-2000:]


# -- no SFT_ variable at all ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "probe"])
def test_run_and_probe_with_no_settings_stop_at_the_plan_on_this_machine(no_settings, command):
    env, work = no_settings
    result = entrypoint(env, work, command)
    one_clear_line(result)
    # Qwen3-8B on two CPU ranks of this small machine: the decision says so, before any rank starts
    assert result.returncode == 3, result.stdout[-3000:]
    assert "error: no ZeRO option fits this machine: nothing fits on 2 x" in result.stdout
    summary = read_summary(work / "output")
    assert summary["status"] == "preflight failed" and summary["exit_code"] == 3
    assert not list((work / "output").glob("checkpoint-*"))


def test_config_with_no_settings(no_settings):
    env, work = no_settings
    result = entrypoint(env, work, "config")
    one_clear_line(result)
    assert result.returncode == 3 and "no ZeRO option fits this machine" in result.stderr
    # issue 46: it said so and printed nothing else; now what the machine would need, and how to ask for one
    assert "; it would need 2 GPU(s) of at least " in result.stderr
    assert "or more GPUs; `config --gpus N --gpu-memory GIB` shows the configuration for such a machine" in result.stderr


def test_config_for_a_machine_the_user_names(no_settings):
    """As `plan` takes it: the configuration the job would use on 8 GPUs of 79.25 GiB, from a machine with none."""
    env, work = no_settings
    env["SFT_MICRO_BATCH"] = "1"  # the cached 300 rows fill one step of 8 GPUs
    result = entrypoint(env, work, "config", "--gpus", "8", "--gpu-memory", "79.25")
    one_clear_line(result)
    assert result.returncode == 0, result.stderr[-3000:]
    shown = json.loads(result.stdout)
    assert shown["machine"] == {"gpus": 8, "gpu_memory_gib": 79.25, "described": True}
    planned = json.loads(entrypoint(env, work, "plan", "--gpus", "8", "--gpu-memory", "79.25", "--json").stdout)
    assert shown["decision"]["ranks"] == 8 and shown["decision"]["stage"] == planned["decision"]["stage"]
    assert shown["decision"]["precision"] == "bf16" and shown["trainer"]["bf16"] is True
    assert shown["deepspeed"]["bf16"]["enabled"] is True  # "auto" filled with the run's precision, not this host's
    assert not (work / "output").exists()


def test_config_on_a_machine_without_gpus_needs_both_numbers(no_settings):
    env, work = no_settings
    result = entrypoint(env, work, "config", "--gpus", "8")
    one_clear_line(result)
    assert result.returncode == 2 and "no GPU here: give --gpus N and --gpu-memory GIB" in result.stderr


def test_plan_with_no_settings(no_settings):
    env, work = no_settings
    result = entrypoint(env, work, "plan", "--gpus", "8", "--gpu-memory", "79.25", "--json")
    one_clear_line(result)
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert plan["decision"]["stage"] == "2"
    assert plan["model"]["name"] == "Qwen/Qwen3-8B"


def test_doctor_with_no_settings(no_settings):
    env, work = no_settings
    result = entrypoint(env, work, "doctor")
    one_clear_line(result)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "the run's needs are unknown (no ZeRO option fits" in result.stdout
    for name in ("driver", "gpus", "nvcc", "cpu_adam", "build_locks", "memlock", "shm", "host_memory", "disk", "topology",
                 "allreduce"):
        assert f"] {name}" in result.stdout


def test_export_of_a_folder_that_is_not_a_checkpoint(no_settings):
    env, work = no_settings
    usage = entrypoint(env, work, "export")
    assert usage.returncode == 2 and "Missing argument 'CHECKPOINT'" in usage.stderr
    result = entrypoint(env, work, "export", str(DEMO_MODEL), str(work / "fp32"))
    one_clear_line(result)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (f"error: {DEMO_MODEL} is not a checkpoint of this job (no latest): give an "
                                     "OUTPUT/checkpoint-N folder the Trainer and DeepSpeed wrote")
    # a torn one: before, DeepSpeed's converter's traceback (FileNotFoundError: can't find *_model_states.pt files)
    torn = work / "checkpoint-1"
    (torn / "global_step1").mkdir(parents=True)
    (torn / "latest").write_text("global_step1")
    shutil.copy(DEMO_MODEL / "config.json", torn)
    result = entrypoint(env, work, "export", str(torn), str(work / "fp32"))
    one_clear_line(result)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"error: {torn} is not complete (no trainer_state.json): export a complete one (`status` names the newest on "
        "disk)")


def test_a_model_that_cannot_be_read_is_one_line(tmp_path):
    env = clean_environ(tmp_path)  # offline, nothing cached
    env["SFT_DATASET"] = str(DEMO_DATA)
    result = entrypoint(env, tmp_path, "config")
    one_clear_line(result)
    assert result.returncode == 2
    # reported with the settings' own problems (here: none), one line
    header, last = result.stderr.strip().splitlines()[-2:]
    assert header == "error: the settings are not valid; nothing was started:"
    assert last.startswith("  - SFT_MODEL='Qwen/Qwen3-8B': cannot read its config.json (")


# -- the tiny model with auto settings, and with the user's own DeepSpeed file -----------------


def demo(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = clean_environ(tmp_path)
    env.update(SFT_MODEL=str(DEMO_MODEL), SFT_DATASET=str(DEMO_DATA), SFT_OUTPUT_DIR=str(tmp_path / "out"),
               **{f"SFT_{k.upper()}": v for k, v in settings.items()})
    return env


def test_config_decides_auto_as_the_run_would(tmp_path):
    """Before: `config` with SFT_ZERO_STAGE=auto (the default) failed with KeyError: 'auto'."""
    result = entrypoint(demo(tmp_path), tmp_path, "config")
    one_clear_line(result)
    assert result.returncode == 0, result.stderr[-3000:]
    shown = json.loads(result.stdout)
    assert shown["decision"]["stage"] == "2" and shown["reasons"]["stage"].startswith("auto: ZeRO-2")
    assert shown["deepspeed"]["zero_optimization"]["stage"] == 2
    assert shown["deepspeed"]["train_micro_batch_size_per_gpu"] == 4  # "auto" filled as the Trainer fills it


@pytest.fixture
def offload_config(tmp_path) -> Path:
    path = tmp_path / "ds_zero3_offload.json"
    path.write_text(json.dumps(SEED_OFFLOAD))
    return path


def test_config_and_plan_with_a_users_offload_file(tmp_path, offload_config):
    env = demo(tmp_path, ds_config=str(offload_config))
    shown = json.loads(entrypoint(env, tmp_path, "config").stdout)
    assert shown["decision"]["stage"] == "3-offload" and shown["decision"]["offload"] is True
    assert shown["deepspeed"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    planned = entrypoint(env, tmp_path, "plan", "--gpus", "1", "--gpu-memory", "80")
    one_clear_line(planned)
    assert "stage: ZeRO-3-offload, as your DeepSpeed file says (SFT_DS_CONFIG)" in planned.stdout


def test_doctor_preflights_a_users_offload_file_as_offload(tmp_path, offload_config):
    """Before: the seed's offload file was preflighted as no offload: host RAM 'info', disk not checked."""
    result = entrypoint(demo(tmp_path, ds_config=str(offload_config)), tmp_path, "doctor")
    one_clear_line(result)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "with ZeRO-3-offload on 2 rank(s)" in result.stdout
    lines = {line.split("]")[1].split()[0]: line for line in result.stdout.splitlines() if line.startswith("[")}
    assert "offload needs" in lines["host_memory"] and lines["host_memory"].startswith("[ok")
    assert "for 3 checkpoints of" in lines["disk"]
    assert "no offload" not in lines["memlock"]


@pytest.mark.slow
def test_probe_and_run_with_a_users_offload_file(tmp_path, offload_config):
    env = demo(tmp_path, ds_config=str(offload_config), probe_steps="3", max_steps="4", save_steps="4",
               max_length="128", precision="fp32")
    probed = entrypoint(env, tmp_path, "probe")
    one_clear_line(probed)
    assert probed.returncode == 0, probed.stdout[-3000:]
    summary = read_summary(tmp_path / "out")
    assert summary["status"] == "probed" and summary["stage"] == "3-offload"
    host = next(c for c in summary["preflight"] if c["name"] == "host_memory")
    assert "offload needs" in host["message"]
    result = entrypoint(env, tmp_path, "run")
    assert result.returncode == 0, result.stdout[-3000:]
    summary = read_summary(tmp_path / "out")
    assert summary["status"] == "done" and summary["stage"] == "3-offload"
    used = json.loads((tmp_path / "out" / "run" / "ds_config.json").read_text())
    assert used["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert (tmp_path / "out" / "final" / "config.json").is_file()


def test_version_names_the_code_and_the_libraries(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "--version"], env=clean_environ(tmp_path),
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("sft-zero ") and "(code " in line
    for library in ("torch", "deepspeed", "transformers", "trl"):
        assert f" {library} " in line


@pytest.mark.parametrize("target", ["run", "probe"])
def test_make_run_and_probe_start_the_container_with_the_readmes_flags(target):
    """Before: no --stop-timeout (docker stop killed the save after 10 s) and no memlock."""
    printed = subprocess.run(["make", "-n", target, "SFT_MODEL=x"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
    readme = (REPO / "README.md").read_text()
    for flag in ("--gpus all", "--ipc=host", "--ulimit memlock=-1", "--stop-timeout 600"):
        assert flag in printed and flag in readme, flag
    assert "-e SFT_MODEL" in printed


def test_status_of_a_folder_that_holds_no_run_and_of_something_else(tmp_path):
    env = clean_environ(tmp_path)
    empty = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "status", str(tmp_path)], env=env,
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 0 and "no run here yet" in empty.stdout
    assert "not a job's output folder, or its job has not started" in empty.stdout  # a model's folder, /tmp...
    neither = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "status", str(tmp_path / "nothing")],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert neither.returncode == 2 and f"{tmp_path / 'nothing'}: no such output folder here" in neither.stderr
    # before: sent to the Hub, whose refusal of the name was said as the Hub not answering (exit 10)
    bad = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "status", "not/a/repo"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not/a/repo is neither an output folder nor a Hub repo (owner/name): Repo id must " \
                                   "be in the form 'repo_name' or 'namespace/repo_name'" in bad.stderr, bad.stderr


@pytest.mark.parametrize("target, said", [
    ("demo/chat.jsonl", "demo/chat.jsonl is a file, not a job's output folder"),
    ("x/y.jsonl", "x/y.jsonl: no such output folder here (a local path, not sent to the Hub)"),
    ("demo/nothing", "demo/nothing: no such output folder here (a local path, not sent to the Hub)"),
    ("./x", "./x: no such output folder here")])
def test_status_of_a_file_or_a_local_path_not_there_says_so_not_the_hub(tmp_path, target, said):
    """Before: a file, or a path not there written with an owner/ (x/y.jsonl), went to the Hub (exit 10 offline,
    after its retries: "cannot read demo/chat.jsonl from the Hub")."""
    result = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), "status", target], env=clean_environ(tmp_path),
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "from the Hub" not in result.stderr, result.stderr
    assert f"error: {said}" in result.stderr and "status takes a job's output folder (SFT_OUTPUT_DIR) or its Hub " \
                                                  "repo (owner/name)" in result.stderr, result.stderr


# -- DeepSpeed's accelerator notice ------------------------------------------------------------


@pytest.mark.parametrize("args", [("plan", "--gpus", "1", "--gpu-memory", "80"), ("data", "--rows", "1"), ("config",)])
def test_the_commands_that_train_nothing_say_nothing_of_deepspeeds_accelerator(tmp_path, args):
    """On a machine without GPUs DeepSpeed warned "Setting accelerator to CPU. If you have GPU or other accelerator,
    we were unable to detect it" at its import: noise for plan, data and config, which train nothing here. On the
    demo they print their answer alone."""
    from conftest import demo_env

    result = entrypoint(demo_env(tmp_path), REPO, *args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    said = result.stdout + result.stderr
    assert "Setting accelerator" not in said and "ds_accelerator" not in said and "[WARNING]" not in said, said[:2000]


def test_deepspeeds_other_warnings_still_show():
    """Only the notice is dropped: every other record of DeepSpeed's logger passes."""
    import logging

    from sft.controller import commands

    logger = logging.getLogger("DeepSpeed")
    before = list(logger.filters)
    try:
        commands.deepspeed_quiet()
        commands.deepspeed_quiet()
        assert len(logger.filters) == len(before) + 1  # each command may ask: one filter
        notice = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
        assert not logger.filter(logging.makeLogRecord({"msg": notice, "levelno": logging.WARNING}))
        for other in ("Setting ds_accelerator to cuda (auto detect)", "NCCL timed out", "cpu_adam op not compatible"):
            assert logger.filter(logging.makeLogRecord({"msg": other, "levelno": logging.ERROR}))
    finally:
        logger.filters[:] = before
