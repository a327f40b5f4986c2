"""Settings from a file as well as the environment: a YAML job file (SFT_CONFIG or `--config`) in TRL's names or
the settings' own, the environment over it, every problem in it named with its line; and `config --env`, the
settings as an env file that reads back to the same settings, with no secret in it. (A finished and a running job's
`config --env OUT`: tests/test_trackers.py, on the job it runs.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, REPO, clean_environ
from sft.settings import SettingsError, from_env

# A job file as TRL's `trl sft --config` takes one, with a setting by its SFT_ name and one by the setting's name
TRL_FILE = f"""\
# trl sft --config job.yaml
model_name_or_path: {DEMO_MODEL}
dataset_name: {DEMO_DATA}
learning_rate: 2.0e-5
num_train_epochs: 2
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
max_length: 512
gradient_checkpointing: true
bf16: false
report_to: [tensorboard, trackio]
packing: false
SFT_SAVE_STEPS: 50
logging_steps: 5
trainer_args:
  weight_decay: 0.01
  lr_scheduler_type: cosine
"""
# The same settings as variables
AS_VARIABLES = dict(SFT_MODEL=str(DEMO_MODEL), SFT_DATASET=str(DEMO_DATA), SFT_LEARNING_RATE="2e-5", SFT_EPOCHS="2",
                    SFT_MICRO_BATCH="2", SFT_GRAD_ACCUM="4", SFT_MAX_LENGTH="512", SFT_GRADIENT_CHECKPOINTING="true",
                    SFT_PRECISION="fp32", SFT_REPORT_TO="tensorboard,trackio", SFT_PACKING="false", SFT_SAVE_STEPS="50",
                    SFT_LOGGING_STEPS="5", SFT_TRAINER_ARGS='{"weight_decay": 0.01, "lr_scheduler_type": "cosine"}')
SECRETS = dict(HF_TOKEN="hf_SecretTokenValue0123456789", WANDB_API_KEY="wandb-secret-0123456789abcdef",
               MLFLOW_TRACKING_TOKEN="mlflow-secret-0123456789")


def job_file(folder: Path, text: str, name: str = "job.yaml") -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def without(s, *names: str) -> dict:
    return {k: v for k, v in s.to_dict().items() if k not in names}


def entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "entrypoint.py"), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def read_env_file(text: str) -> dict[str, str]:
    """As `docker run --env-file` reads one: VAR=value a line, the value as written; # starts a comment."""
    return dict(line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))


def test_a_trl_job_file_gives_the_settings_its_variables_give(isolated_env):
    path = job_file(isolated_env, TRL_FILE)
    from_file = from_env({"SFT_CONFIG": path})
    assert from_file.config == path
    assert without(from_file, "config") == without(from_env(AS_VARIABLES), "config")


def test_the_environment_wins_over_the_file(isolated_env):
    path = job_file(isolated_env, TRL_FILE)
    s = from_env({"SFT_CONFIG": path, "SFT_LEARNING_RATE": "3e-4", "SFT_EPOCHS": " "})
    assert (s.learning_rate, s.epochs, s.max_length) == (3e-4, 2.0, 512)  # a blank variable leaves the file's


def test_every_problem_in_the_file_at_once_each_with_its_line(isolated_env):
    path = job_file(isolated_env, f"""\
model: {DEMO_MODEL}
leraning_rate: 1e-5
num_train_epochs: many
SFT_ZERO_STAGE: 4
hub_token: hf_NotToBeShown0123456789
weight_decay: 0.01
bf16: maybe
max_length: 512
max_length: 1024
""")
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_CONFIG": path, "SFT_PACKING": "perhaps"})
    problems = e.value.problems
    head = f"SFT_CONFIG={path!r}: line"
    expected = [f"{head} 2, leraning_rate: unknown key (did you mean learning_rate?",
                f"{head} 3, num_train_epochs: SFT_EPOCHS='many': expected a number",
                f"{head} 4, SFT_ZERO_STAGE: SFT_ZERO_STAGE='4': expected one of auto, 1, 2, 3, 1-8bit, 2-8bit",
                f"{head} 5, hub_token: a secret is read from the environment only",
                f"{head} 6, weight_decay: unknown key (",
                f"{head} 7, bf16: 'maybe': expected true or false",
                f"{head} 9: max_length is written twice",
                "SFT_PACKING='perhaps': expected true or false"]
    for start in expected:
        assert sum(p.startswith(start) for p in problems) == 1, (start, problems)
    assert len(problems) == len(expected), problems
    assert "under trainer_args:" in problems[[p.startswith(expected[4]) for p in problems].index(True)]
    assert "NotToBeShown" not in "\n".join(problems)


def test_a_key_under_another_tools_name_is_pointed_to_its_setting(isolated_env):
    """Spelling alone found nothing near 'lr'; the environment's variables are told the same (test_settings.py)."""
    path = job_file(isolated_env, "lr: 2e-5\nmax_seq_length: 1024\n")
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_CONFIG": path})
    assert [p.split(" (")[1].split(";")[0] for p in e.value.problems] == ["did you mean learning_rate?",
                                                                           "did you mean max_length?"]


@pytest.mark.parametrize("text, why", [
    ("model: x\n  dataset: [y\n", "not YAML at line 2, column 10: mapping values are not allowed here"),
    ("- model: x\n", "expected a mapping of settings (learning_rate: 2e-5, one a line), found a list"),
    ("config: other.yaml\n", "line 1, config: a job file cannot name another"),
])
def test_a_file_that_is_not_a_job_file_says_why(isolated_env, text, why):
    path = job_file(isolated_env, text)
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_CONFIG": path})
    assert any(p.startswith(f"SFT_CONFIG={path!r}: ") and why in p for p in e.value.problems), e.value.problems


def test_an_unquoted_time_reads_as_the_variable_would(isolated_env):
    path = job_file(isolated_env, "time_limit: 2030-12-01T18:00:00Z\n")  # YAML makes it a datetime
    assert from_env({"SFT_CONFIG": path}).time_limit == "2030-12-01T18:00:00Z"


def test_a_missing_job_file(isolated_env):
    with pytest.raises(SettingsError, match=r"SFT_CONFIG='/nowhere/job.yaml': cannot read it \(No such file or "
                                            r"directory\): expected a YAML job file"):
        from_env({"SFT_CONFIG": "/nowhere/job.yaml"})


def test_a_bad_job_file_stops_the_job_with_exit_2_before_anything_is_written(tmp_path):
    """The real entrypoint, the file given by --config: every problem listed, nothing written, no secret shown."""
    env = {**clean_environ(tmp_path), **SECRETS, "SFT_OUTPUT_DIR": str(tmp_path / "out"), "SFT_MAX_STEPS": "0x"}
    path = job_file(tmp_path, f"model_name_or_path: {DEMO_MODEL}\ndataset_name: {DEMO_DATA}\nlearning_rate: fast\n"
                              "per_device_train_batch_sise: 2\n")
    result = entrypoint(env, "--config", path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"SFT_CONFIG={path!r}: line 3, learning_rate: SFT_LEARNING_RATE='fast': expected a number" in result.stderr
    assert (f"SFT_CONFIG={path!r}: line 4, per_device_train_batch_sise: unknown key (did you mean "
            "per_device_train_batch_size?" in result.stderr)
    assert "SFT_MAX_STEPS='0x': expected a whole number" in result.stderr
    assert not (tmp_path / "out").exists()
    assert not any(secret in result.stdout + result.stderr for secret in SECRETS.values())


def test_a_job_files_settings_reach_the_trainers_arguments(tmp_path):
    env = {**clean_environ(tmp_path), "SFT_OUTPUT_DIR": str(tmp_path / "out")}
    result = entrypoint(env, "--config", job_file(tmp_path, TRL_FILE), "config")
    assert result.returncode == 0, result.stderr[-3000:]
    trainer = json.loads(result.stdout)["trainer"]
    assert (trainer["learning_rate"], trainer["num_train_epochs"], trainer["max_length"]) == (2e-5, 2.0, 512)
    assert (trainer["per_device_train_batch_size"], trainer["gradient_accumulation_steps"]) == (2, 4)
    assert (trainer["weight_decay"], trainer["lr_scheduler_type"]) == (0.01, "cosine")
    assert trainer["report_to"] == ["tensorboard", "trackio"]


def test_config_env_prints_this_environment_as_an_env_file_that_reads_back_the_same(tmp_path):
    """SFT_CONFIG's file and the environment over it, printed with no secret; read back as docker reads an env
    file, alone (no file), it gives the same settings."""
    env = {**clean_environ(tmp_path), **SECRETS, "SFT_OUTPUT_DIR": str(tmp_path / "out"), "SFT_SEED": "7",
           "SFT_RUN_NAME": "a run, with = and spaces", "SFT_CONFIG": job_file(tmp_path, TRL_FILE)}
    printed = entrypoint(env, "config", "--env")
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert not any(secret in printed.stdout + printed.stderr for secret in SECRETS.values())
    variables = read_env_file(printed.stdout)
    assert "SFT_CONFIG" not in variables and variables["SFT_LEARNING_RATE"] == "2e-05"
    assert variables["SFT_RUN_NAME"] == "a run, with = and spaces"
    original = from_env({k: v for k, v in env.items() if k.startswith("SFT_")})
    assert without(from_env(variables), "config") == without(original, "config")


def test_the_example_env_file_and_job_file_say_the_same_job(isolated_env):
    """docs/examples/: the README's two ways to bring settings in a file, read as docker and the job read them."""
    examples = REPO / "docs" / "examples"
    variables = read_env_file((examples / "job.env").read_text())
    out = {"SFT_OUTPUT_DIR": str(isolated_env / "out")}  # /data/output needs a mounted /data
    from_env_file = from_env({**{k: v for k, v in variables.items() if k.startswith("SFT_")}, **out})
    from_job_file = from_env({"SFT_CONFIG": str(examples / "job.yaml"), **out})
    assert without(from_env_file, "config") == without(from_job_file, "config")
    assert (from_job_file.model, from_job_file.hub_repo, from_job_file.report_to) == (
        "Qwen/Qwen3-8B", "you/qwen3-8b-sft", "wandb")
