"""Settings: every variable's good and bad values, unknown names, all problems at once, exit code 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, clean_environ, demo_env, run_entrypoint
from sft.controller import inputs, prepare
from sft.settings import Settings, SettingsError, describe, from_env


def test_no_variables_gives_the_seed_job_with_fast_settings(isolated_env):
    s = from_env({})
    assert (s.model, s.dataset, s.dataset_split) == ("Qwen/Qwen3-8B", "trl-lib/Capybara", "train")
    assert (s.max_length, s.epochs, s.learning_rate, s.save_total_limit) == (2048, 1.0, 1e-5, 2)
    # checkpoints by time, as often as the uploader sends one (issue 42): none saved only to be deleted unseen
    assert (s.save_steps, s.save_minutes, s.upload_minutes, s.save_seconds) == (None, None, 30.0, 1800.0)
    # the seed's micro-batch 1 x accumulation 4 of padded conversations, as 8,192 tokens a step: 4 packed rows
    # of 2048 (the decision splits them, tests/test_decide.py; docs/speed.md)
    assert (s.packing, s.tokens_per_step, s.micro_batch, s.grad_accum) == (True, 8192, None, None)
    assert (s.attention, s.gradient_checkpointing, s.liger_kernels, s.compile) == ("auto", "auto", "auto", "auto")
    assert (s.zero_stage, s.probe_steps, s.max_steps) == ("auto", 50, -1)


GOOD = [
    ("SFT_ZERO_STAGE", "3-offload", "zero_stage", "3-offload"),
    ("SFT_ZERO_STAGE", "1", "zero_stage", "1"),
    ("SFT_PROBE_STEPS", "0", "probe_steps", 0),
    ("SFT_MAX_STEPS", "100", "max_steps", 100),
    ("SFT_EPOCHS", "0.5", "epochs", 0.5),
    ("SFT_MICRO_BATCH", "4", "micro_batch", 4),
    ("SFT_GRAD_ACCUM", "8", "grad_accum", 8),
    ("SFT_TOKENS_PER_STEP", "65536", "tokens_per_step", 65536),
    ("SFT_GRADIENT_CHECKPOINTING", "offload", "gradient_checkpointing", "offload"),
    ("SFT_GRADIENT_CHECKPOINTING", "yes", "gradient_checkpointing", "true"),
    ("SFT_MAX_LENGTH", "4096", "max_length", 4096),
    ("SFT_LEARNING_RATE", "2e-5", "learning_rate", 2e-5),
    ("SFT_SAVE_STEPS", "50", "save_steps", 50),
    ("SFT_SAVE_TOTAL_LIMIT", "3", "save_total_limit", 3),
    ("SFT_GRADIENT_CHECKPOINTING", "false", "gradient_checkpointing", "false"),
    ("SFT_GRADIENT_CHECKPOINTING", "1", "gradient_checkpointing", "true"),
    ("SFT_GRADIENT_CHECKPOINTING", "auto", "gradient_checkpointing", "auto"),
    ("SFT_PACKING", "no", "packing", False),
    ("SFT_ATTENTION", "sdpa", "attention", "sdpa"),
    ("SFT_SEED", "7", "seed", 7),
    ("SFT_GPUS", "0,1,2,3", "gpus", "0,1,2,3"),
    ("SFT_LAUNCHER", "deepspeed", "launcher", "deepspeed"),
    ("SFT_PRICE_PER_HOUR", "23.5", "price_per_hour", 23.5),
    ("SFT_MODEL", str(DEMO_MODEL), "model", str(DEMO_MODEL)),
    ("SFT_DATASET", str(DEMO_DATA), "dataset", str(DEMO_DATA)),
    ("SFT_DATASET", "HuggingFaceH4/ultrachat_200k", "dataset", "HuggingFaceH4/ultrachat_200k"),
    ("SFT_HUB_REPO", "alice/qwen3-sft", "hub_repo", "alice/qwen3-sft"),
    ("SFT_NODE_TIMEOUT_SECONDS", "30", "node_timeout_seconds", 30),
    ("SFT_LIGER_KERNELS", "off", "liger_kernels", "false"),
    ("SFT_SEQUENCE_PARALLEL", "auto", "sequence_parallel", "auto"),
    ("SFT_SEQUENCE_PARALLEL", "AUTO", "sequence_parallel", "auto"),
    ("SFT_SEQUENCE_PARALLEL", "1", "sequence_parallel", 1),
    ("SFT_LONG_ROWS", "drop", "long_rows", "drop"),
    ("SFT_LONG_ROWS", "error", "long_rows", "error"),
    ("SFT_TRAINER_ARGS", '{"torch_compile_mode": "max-autotune", "dataloader_num_workers": 2}', "trainer_args",
     '{"torch_compile_mode": "max-autotune", "dataloader_num_workers": 2}'),
    ("SFT_REPORT_TO", "tensorboard,trackio", "report_to", "tensorboard,trackio"),
    ("SFT_REPORT_TO", "none", "report_to", "none"),
    ("SFT_RUN_NAME", "qwen3-lr1e-5", "run_name", "qwen3-lr1e-5"),
    ("SFT_TIME_LIMIT", "3h30m", "time_limit", "3h30m"),
    ("SFT_TIME_LIMIT", "2026-12-01T18:00:00Z", "time_limit", "2026-12-01T18:00:00Z"),
    ("SFT_MAX_HOURS", "1.5", "max_hours", 1.5),
    ("SFT_BUDGET_ACTION", "truncate", "budget_action", "truncate"),
]


@pytest.mark.parametrize("var,raw,field,value", GOOD)
def test_good_value(isolated_env, var, raw, field, value):
    assert getattr(from_env({var: raw}), field) == value


BAD = [
    ("SFT_ZERO_STAGE", "4", "expected one of auto, 1, 2, 3, 1-8bit, 2-8bit, 3-8bit, 3-offload, 3-offload-all"),
    ("SFT_OPTIMIZER", "adam", "expected one of auto, adamw, adamw-8bit"),
    ("SFT_PROBE_STEPS", "-1", "expected at least 0"),
    ("SFT_PROBE_STEPS", "fifty", "expected a whole number"),
    ("SFT_MAX_STEPS", "0", "expected -1 (full epochs) or a positive number"),
    ("SFT_EPOCHS", "0", "expected more than 0"),
    ("SFT_MICRO_BATCH", "0", "expected at least 1"),
    ("SFT_GRAD_ACCUM", "1.5", "expected a whole number"),
    ("SFT_LEARNING_RATE", "fast", "expected a number"),
    ("SFT_GRADIENT_CHECKPOINTING", "maybe", "expected auto, true, false or offload"),
    ("SFT_PACKING", "auto", "expected true or false (1/0, yes/no, on/off)"),
    ("SFT_ATTENTION", "flash", "expected one of auto, flex_attention, sdpa, eager"),
    ("SFT_GPUS", "0,,1", "expected all, or GPU indices such as 0,1,2,3"),
    ("SFT_GPUS", "1,1", "a GPU is listed twice"),
    ("SFT_LAUNCHER", "mpirun", "expected one of torchrun, deepspeed"),
    ("SFT_PRICE_PER_HOUR", "-3", "expected more than 0"),
    ("SFT_MODEL", "./no/such/model", "no such file or folder"),
    ("SFT_MODEL", "not a name!", "neither a local path nor a Hub name"),
    ("SFT_DATASET", str(DEMO_MODEL / "chat_template.jinja"), "expected a .jsonl, .json, .parquet, .csv file"),
    ("SFT_DATASET", "a.jsonl:0", "a row count must be at least 1"),
    ("SFT_DATASET", "a.jsonl,,b.jsonl", "an empty entry"),
    ("SFT_DATASET", f"{DEMO_DATA}:-5", "no such file or folder (':-5' is no amount: a row count such as :5000, or a "
     "weight such as :0.5)"),
    ("SFT_LOSS_ON", "prompt", "expected one of auto, all, assistant, completion"),
    ("SFT_EVAL_FRACTION", "1", "expected less than 1"),
    ("SFT_EVAL_STEPS", "0", "expected at least 1"),
    ("SFT_EVAL_STEPS", "50", "nothing to evaluate on: set SFT_EVAL_DATASET, SFT_EVAL_SPLIT or SFT_EVAL_FRACTION"),
    ("SFT_CHAT_TEMPLATE", str(DEMO_MODEL / "config.json"), "expected a .jinja (or .j2) template file, or a model"),
    ("SFT_CHAT_TEMPLATE", "/no/such.jinja", "no such file or folder"),
    ("SFT_DS_CONFIG", "/nonexistent.json", "no such file"),
    ("SFT_HUB_REPO", "just-a-name", "expected a repo id such as"),
    ("SFT_NODE_TIMEOUT_SECONDS", "0", "expected at least 1"),
    ("SFT_LIGER_KERNELS", "maybe", "expected true or false (1/0, yes/no, on/off), or auto"),
    ("SFT_SEQUENCE_PARALLEL", "two", "expected auto or a whole number"),
    ("SFT_SEQUENCE_PARALLEL", "0", "expected at least 1"),
    ("SFT_SEQUENCE_PARALLEL", "2", "needs SFT_PACKING=false: Ulysses attention over sdpa drops the mask"),
    ("SFT_LONG_ROWS", "split", "expected one of truncate, drop, error"),
    ("SFT_TRAINER_ARGS", "{torch_compile: true}", "not JSON"),
    ("SFT_TRAINER_ARGS", '["torch_compile"]', 'expected a JSON object such as {"dataloader_num_workers": 2}'),
    ("SFT_TRAINER_ARGS", '{"torch_compiled": true}', "torch_compiled: unknown argument (did you mean torch_compile?)"),
    ("SFT_TRAINER_ARGS", '{"per_device_train_batch_size": 8}',
     "per_device_train_batch_size is set by the job: use SFT_MICRO_BATCH"),
    # before: report_to here killed every rank ("got multiple values"); now the setting of its own is named
    ("SFT_TRAINER_ARGS", '{"report_to": "wandb"}', "report_to is set by the job: use SFT_REPORT_TO"),
    ("SFT_TRAINER_ARGS", '{"run_name": "x"}', "run_name is set by the job: use SFT_RUN_NAME"),
    # before: a value TRL's SFTConfig refuses was a traceback in `config` and failed every rank of a run
    ("SFT_TRAINER_ARGS", '{"lr_scheduler_type": "cosin"}', "lr_scheduler_type: 'cosin' is not one of TRL's: linear, "
     "cosine, cosine_with_restarts,"),
    ("SFT_TRAINER_ARGS", '{"optim": "adam"}', "optim: 'adam' is not one of TRL's: adamw_torch, adamw_torch_fused,"),
    ("SFT_TRAINER_ARGS", '{"warmup_steps": "10"}', 'warmup_steps: "10" is text, not a number (JSON writes those '
     "without quotes)"),
    ("SFT_TRAINER_ARGS", '{"dataloader_num_workers": 1.5}', "dataloader_num_workers: 1.5 is not a whole number"),
    ("SFT_TRAINER_ARGS", '{"dataloader_pin_memory": "no"}', 'dataloader_pin_memory: "no" is text, not true or false'),
    ("SFT_REPORT_TO", "tensorbord", "tensorbord: unknown tracker (expected tensorboard, trackio, wandb, mlflow)"),
    ("SFT_REPORT_TO", "none,trackio", "none cannot be listed with trackers"),
    ("SFT_TIME_LIMIT", "3 hours", "expected a duration such as 3h30m, 90m or 45s, or an end time such as"),
    ("SFT_TIME_LIMIT", "0m", "expected a duration above zero"),
    ("SFT_MAX_HOURS", "0", "expected more than 0"),
    ("SFT_MAX_COST", "5.5", "needs SFT_PRICE_PER_HOUR"),
    ("SFT_BUDGET_ACTION", "warn", "expected one of refuse, truncate"),
    ("SFT_HUB_REVISION", "run-2", "needs SFT_HUB_REPO"),
    # issue 46: numbers the libraries cannot take, names the Hub refuses, folders the job must not write in
    ("SFT_LEARNING_RATE", "inf", "expected a finite number"),
    ("SFT_LEARNING_RATE", "nan", "expected a finite number"),
    ("SFT_EPOCHS", "1e999", "expected a finite number"),
    ("SFT_MICRO_BATCH", "9" * 400, "expected at most 2147483647"),
    ("SFT_MAX_LENGTH", "99999999999999999999", "expected at most 2147483647"),
    ("SFT_SEED", str(2**32), "expected at most 4294967295"),
    ("SFT_UPLOAD_MINUTES", "1e12", "expected at most 1e+09"),
    ("SFT_HUB_REPO", "you/qwen--sft", "Cannot have -- or .. in repo_id"),
    ("SFT_HUB_REPO", "you/qwen.git", "expected a repo id such as"),
    ("SFT_HUB_REPO", "you/" + "q" * 97, "the maximum length is 96"),
    ("SFT_MODEL", "Qwen/café", "neither a local path nor a Hub name such as Qwen/Qwen3-8B (Repo id must use"),
    ("SFT_OUTPUT_DIR", "/", "is the filesystem root"),
    ("SFT_OUTPUT_DIR", "/etc/sft", "in the system's folders"),
    ("SFT_OUTPUT_DIR", "/usr", "in the system's folders"),
    ("SFT_OUTPUT_DIR", "/tmp", "a system folder"),
    ("SFT_OUTPUT_DIR", "x" * 300, "a folder name of 300 bytes: Linux takes at most 255"),
    ("SFT_EMPTY_ROWS", "keep", "expected one of error, drop"),
]


def problems_of(environ: dict[str, str]) -> list[str]:
    """What every command reports of these settings before it starts: theirs, and the checks of what they name that
    every command runs (SFT_TRAINER_ARGS against TRL's SFTConfig)."""
    return prepare.checked(inputs.ALWAYS, gpus=(), environ=environ).problems


@pytest.mark.parametrize("var,raw,message", BAD)
def test_bad_value_names_variable_value_and_fix(isolated_env, var, raw, message):
    (problem,) = problems_of({var: raw})
    assert problem.startswith(f"{var}={raw!r}: ")
    assert message in problem


def test_a_relative_path_with_a_bad_amount_and_a_template_file_not_there_are_named_as_paths(isolated_env,
                                                                                              monkeypatch):
    """Before, a relative data path with an amount that does not parse was called 'neither a local path nor a Hub
    name (Repo id must use alphanumeric chars ...)', and a .jinja file not there passed the settings, then was blamed
    on SFT_MODEL ('cannot load its tokenizer ... check the network, and HF_HUB_OFFLINE')."""
    monkeypatch.chdir(DEMO_DATA.parent.parent)
    assert problems_of({"SFT_DATASET": "demo/chat.jsonl:-5"}) == [
        "SFT_DATASET='demo/chat.jsonl:-5': no such file or folder (':-5' is no amount: a row count such as :5000, or a "
        "weight such as :0.5)"]
    for name in ("chatml.jinja", "templates/chatml.j2"):
        assert problems_of({"SFT_CHAT_TEMPLATE": name}) == [f"SFT_CHAT_TEMPLATE={name!r}: no such file or folder"]
    good = {"SFT_DATASET": "demo/chat.jsonl:5", "SFT_CHAT_TEMPLATE": "demo/chatml-assistant-mask.jinja"}
    assert problems_of(good) == []


def test_flash_attention_4_is_refused_where_it_is_not_installed(isolated_env):
    """This CPU machine has no flash-attn-4 (installed with CUDA builds of torch only, scripts/install-deps.sh)."""
    from sft.settings.checks import flash_attention_4_installed

    assert not flash_attention_4_installed()
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_ATTENTION": "flash_attention_4"})
    assert any(p.startswith("SFT_ATTENTION='flash_attention_4': flash-attn-4 is not installed here (the image has "
                            "it;") for p in e.value.problems), e.value.problems
    assert from_env({"SFT_ATTENTION": "flex_attention"}).attention == "flex_attention"


def test_liger_kernels_are_refused_with_a_compiled_model(isolated_env):
    """Compiled with Liger's kernels, the loss was NaN from the third step on an H200 (docs/speed.md)."""
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_LIGER_KERNELS": "true", "SFT_COMPILE": "true"})
    assert any(p.startswith("SFT_LIGER_KERNELS='true': not with SFT_COMPILE=true: compiled with Liger's kernels")
               for p in e.value.problems), e.value.problems
    from_env({"SFT_LIGER_KERNELS": "false", "SFT_COMPILE": "true"})  # either alone is fine
    from_env({"SFT_LIGER_KERNELS": "auto", "SFT_COMPILE": "true"})


def test_checkpoints_go_by_the_upload_interval_unless_minutes_or_steps_say_otherwise(isolated_env):
    assert from_env({"SFT_UPLOAD_MINUTES": "12"}).save_seconds == 720.0  # no Hub repo: the same default
    assert from_env({"SFT_UPLOAD_MINUTES": "12", "SFT_SAVE_MINUTES": "0.5"}).save_seconds == 30.0
    by_steps = from_env({"SFT_SAVE_STEPS": "50"})
    assert (by_steps.save_steps, by_steps.save_seconds) == (50, None)
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_SAVE_MINUTES": "10", "SFT_SAVE_STEPS": "50", "SFT_SAVE_TOTAL_LIMIT": "0"})
    assert "SFT_SAVE_MINUTES='10.0': not with SFT_SAVE_STEPS=50: checkpoints are saved by time or by steps; unset " \
           "one of them" in e.value.problems
    assert any(p.startswith("SFT_SAVE_TOTAL_LIMIT=") for p in e.value.problems)  # with the others, at once
    assert any(p.startswith("SFT_SAVE_MINUTES='0': ") for p in problems_of({"SFT_SAVE_MINUTES": "0"}))


def test_a_split_row_asks_for_unpacked_rows_sdpa_and_a_length_it_divides(isolated_env):
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_SEQUENCE_PARALLEL": "3", "SFT_ATTENTION": "flex_attention", "SFT_MAX_LENGTH": "1000"})
    assert [p.split(": needs ")[1].split(":")[0] for p in e.value.problems] == [
        "SFT_PACKING=false", "SFT_ATTENTION=auto or sdpa", "an SFT_MAX_LENGTH that 3 divides"]
    assert from_env({"SFT_SEQUENCE_PARALLEL": "4", "SFT_PACKING": "false"}).sequence_parallel == 4


def test_trainer_args_values_sftconfig_takes_pass_and_config_names_one_it_refuses(isolated_env, tmp_path):
    good = {"lr_scheduler_type": "cosine", "warmup_steps": 5, "weight_decay": 0, "dataloader_pin_memory": False,
            "torch_compile_mode": "max-autotune", "gradient_checkpointing_kwargs": {"use_reentrant": False},
            "neftune_noise_alpha": 5, "eos_token": None}
    assert problems_of({"SFT_TRAINER_ARGS": json.dumps(good)}) == []
    result = run_entrypoint(demo_env(tmp_path, trainer_args='{"lr_scheduler_type": "bogus"}'), "config")
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "lr_scheduler_type: 'bogus' is not one of TRL's: linear," in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_a_token_in_trainer_args_is_refused_and_never_shown(isolated_env):
    for raw in ('{"hub_token": "hf_abcdefghijkl", "seed": 1}', '{"hub_token": hf_abcdefghijkl}'):
        found = problems_of({"SFT_TRAINER_ARGS": raw})
        assert found and "hf_abcdefghijkl" not in "\n".join(found)
    assert any("hub_token is set by the job: use HF_TOKEN in the environment" in p
               for p in problems_of({"SFT_TRAINER_ARGS": '{"hub_token": "hf_abcdefghijkl"}'}))


def test_liger_kernels_true_needs_liger_and_triton(isolated_env):
    from sft.settings.checks import liger_available

    if liger_available():
        pytest.skip("liger-kernel and triton are installed here: the error cannot happen")
    with pytest.raises(SettingsError, match="SFT_LIGER_KERNELS='true': liger-kernel and triton are not both "
                                            "installed here"):
        from_env({"SFT_LIGER_KERNELS": "true"})


def test_model_folder_without_config(isolated_env, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SettingsError, match="expected a model folder with config.json"):
        from_env({"SFT_MODEL": str(tmp_path / "empty")})


def test_user_ds_config_must_be_deepspeed_json(isolated_env, tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    with pytest.raises(SettingsError, match="not a readable JSON file"):
        from_env({"SFT_DS_CONFIG": str(bad)})
    bad.write_text(json.dumps({"train_batch_size": 8}))
    with pytest.raises(SettingsError, match="zero_optimization"):
        from_env({"SFT_DS_CONFIG": str(bad)})


def test_unknown_variable_is_an_error_with_a_suggestion(isolated_env):
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_MICROBATCH": "2"})
    assert e.value.problems == ["SFT_MICROBATCH: unknown setting (did you mean SFT_MICRO_BATCH?)"]


def test_an_unknown_variable_under_another_tools_name_is_pointed_to_its_setting(isolated_env):
    """Spelling alone pointed SFT_LR to SFT_MODEL, TRL's gradient_accumulation_steps to gradient checkpointing and
    TRL's warmup_ratio to SFT_EVAL_FRACTION."""
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_LR": "1e-4", "SFT_GRADIENT_ACCUMULATION_STEPS": "4", "SFT_HUB_MODEL_ID": "me/x",
                  "SFT_WARMUP_RATIO": "0.1"})
    assert e.value.problems == [
        "SFT_GRADIENT_ACCUMULATION_STEPS: unknown setting (did you mean SFT_GRAD_ACCUM?)",
        "SFT_HUB_MODEL_ID: unknown setting (did you mean SFT_HUB_REPO?)",
        "SFT_LR: unknown setting (did you mean SFT_LEARNING_RATE?)",
        "SFT_WARMUP_RATIO: unknown setting (see `entrypoint.py --help` for the list; TRL's other arguments go in "
        "SFT_TRAINER_ARGS)"]


def test_a_setting_named_in_lower_case_is_refused_not_ignored(isolated_env):
    """Before: sft_learning_rate=1e-3 was not a variable of the job's, and the run trained at the default rate."""
    with pytest.raises(SettingsError) as e:
        from_env({"sft_learning_rate": "1e-3", "Sft_Epochs": "3", "sft_other": "1"})
    assert e.value.problems == ["Sft_Epochs: unknown setting (a variable's name is upper case: SFT_EPOCHS)",
                                "sft_learning_rate: unknown setting (a variable's name is upper case: "
                                "SFT_LEARNING_RATE)"]


def test_every_problem_is_reported_at_once(isolated_env):
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_ZERO_STAGE": "9", "SFT_EPOCHS": "x", "SFT_LERNING_RATE": "1", "SFT_SEED": "-2"})
    assert len(e.value.problems) == 4


def test_every_setting_is_documented():
    rows = describe()
    assert len(rows) == len(Settings.__dataclass_fields__)
    assert all(var.startswith("SFT_") and help for var, _, help in rows)


def test_bad_settings_exit_2_and_write_nothing(tmp_path):
    out = tmp_path / "out"
    env = clean_environ(tmp_path)
    env.update(SFT_OUTPUT_DIR=str(out), SFT_ZERO_STAGE="4", SFT_MICRO_BATCH="none", SFT_TYPO="1")
    result = run_entrypoint(env)
    assert result.returncode == 2, result.stderr
    assert "SFT_ZERO_STAGE='4': expected one of" in result.stderr
    assert "SFT_MICRO_BATCH='none': expected a whole number" in result.stderr
    assert "SFT_TYPO: unknown setting" in result.stderr
    assert not out.exists()


def test_help_lists_every_variable(tmp_path):
    result = run_entrypoint(clean_environ(tmp_path), "--help")
    assert result.returncode == 0
    for var, default, _ in describe():
        assert f"{var} [{default}]" in result.stdout
    assert "HF_TOKEN" in result.stdout and "143 STOPPED" in result.stdout


def test_config_prints_the_deepspeed_json_with_autos_filled(tmp_path):
    env = clean_environ(tmp_path)
    env.update(SFT_ZERO_STAGE="3-offload", SFT_MODEL=str(DEMO_MODEL), SFT_DATASET=str(DEMO_DATA), SFT_MICRO_BATCH="2",
               SFT_GRAD_ACCUM="2", SFT_OUTPUT_DIR=str(tmp_path / "out"))
    result = run_entrypoint(env, "config")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    ds = printed["deepspeed"]
    assert printed["settings"]["zero_stage"] == "3-offload" and printed["ranks"] == 2
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert '"auto"' not in json.dumps(ds)
    assert ds["train_batch_size"] == 2 * 2 * 2 and ds["optimizer"]["params"]["lr"] == 1e-5
    assert ds["zero_optimization"]["reduce_bucket_size"] == 64 * 64  # hidden_size**2, as the Trainer fills it
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["report_to", "logging_first_step", "output_dir", "deepspeed", "dataset_num_proc"])
def test_trainer_args_the_job_sets_are_refused(isolated_env, name):
    """Before: report_to and logging_first_step passed here, then every rank died with "got multiple values"."""
    assert any(f"{name} is set by the job" in p for p in problems_of({"SFT_TRAINER_ARGS": json.dumps({name: "x"})}))


def spec_of(settings: Settings, d, mode: str = "train"):
    """The RunSpec a launch of this decision gets (controller/runs.py), writing nothing."""
    from sft.controller.output import Paths
    from sft.controller.runs import make_spec

    return make_spec(settings, d, Paths(settings.output_path), mode, settings.output_path, settings.max_steps)


def test_every_argument_the_job_sets_is_owned():
    """The list settings refuses is the list the ranks set: both are planner/arguments.py's one table."""
    from test_decide import decided

    from sft.handoff import DataPlan, DataSource
    from sft.planner.arguments import OWNED

    d = dataclasses.replace(decided(), bf16=False, data=DataPlan([DataSource("d")], eval_fraction=0.1, eval_steps=5,
                                                                  loss_on="assistant"))  # bf16: not on this CPU
    job = spec_of(Settings(), d).trainer
    assert set(job) == set(OWNED)
    assert job["parallelism_config"] is None  # one GPU a row: no split
    assert job["pad_to_multiple_of"] == "auto"  # TRL's own default
    assert job["dataset_num_proc"] is None  # one process: TRL's default
    d = dataclasses.replace(d, data=dataclasses.replace(d.data, processes=3))
    assert spec_of(Settings(), d).sft_config(in_rank=False).dataset_num_proc == 3  # what TRL's map takes
    with_user = spec_of(Settings(trainer_args='{"dataloader_num_workers": 2}'), d).trainer
    assert with_user == {**job, "dataset_num_proc": 3, "dataloader_num_workers": 2}


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_not_installed_says_how_to_add_it(isolated_env, monkeypatch, tracker):
    """The image has all four; a host or an image of one's own may not. A module that is None in sys.modules is one
    that Python's import system (importlib.util.find_spec, which the check asks) finds no more."""
    import sys

    monkeypatch.setitem(sys.modules, tracker, None)
    with pytest.raises(SettingsError) as e:
        from_env({"SFT_REPORT_TO": f"tensorboard,{tracker}"})
    (problem,) = e.value.problems
    assert problem.startswith(f"SFT_REPORT_TO='tensorboard,{tracker}': {tracker} is not installed in this image (it "
                              "has tensorboard, trackio, wandb, mlflow)")
    assert f"RUN /opt/venv/bin/pip install {tracker}" in problem


def test_a_budget_needs_the_probe(isolated_env):
    with pytest.raises(SettingsError, match="SFT_PROBE_STEPS='0': SFT_MAX_HOURS and SFT_MAX_COST are checked"):
        from_env({"SFT_MAX_HOURS": "2", "SFT_PROBE_STEPS": "0"})


@pytest.mark.parametrize("branch, ok", [("run-2", True), ("exp/lr-1e-5", True), ("a..b", False), ("-x", False),
                                        ("x/", False), ("has space", False)])
def test_hub_revision_is_a_branch_name(isolated_env, branch, ok):
    env = {"SFT_HUB_REPO": "alice/runs", "SFT_HUB_REVISION": branch}
    if ok:
        assert from_env(env).hub_revision == branch
    else:
        with pytest.raises(SettingsError, match="expected a branch name such as run-2"):
            from_env(env)


def test_a_split_row_reaches_the_trainer_as_accelerates_sequence_parallelism():
    """SFT_SEQUENCE_PARALLEL=N: Accelerate's ParallelismConfig for DeepSpeed's Ulysses, world / N data-parallel
    groups, the attention it wraps, and rows padded so they split evenly (on CPU ranks to the whole length)."""
    from test_decide import decided

    from sft.planner.inputs import Ranks
    from sft.handoff.spec import parallelism

    s = Settings(max_length=64, packing=False)
    on_gpu = dataclasses.replace(decided(), ranks=Ranks(8, tuple(range(8))), sequence_parallel=2, attention="sdpa")
    job = spec_of(s, on_gpu).trainer
    pc = parallelism(job["parallelism_config"])  # what the ranks give SFTConfig
    assert (pc.sp_backend, pc.sp_size, pc.dp_replicate_size, pc.data_parallel_size) == ("deepspeed", 2, 4, 4)
    assert pc.sp_handler.sp_attn_implementation == "sdpa" and pc.sp_handler.sp_seq_length_is_variable
    cpu = dataclasses.replace(on_gpu, ranks=Ranks(2, ()), bf16=False)
    assert job["pad_to_multiple_of"] == 2 and spec_of(s, cpu).trainer["pad_to_multiple_of"] == 64
    args = spec_of(s, cpu).sft_config(in_rank=False)  # TRL's and Transformers' own checks take it
    assert args.parallelism_config.sp_size == 2 and args.pad_to_multiple_of == 64


@pytest.mark.parametrize("environ,message", [
    ({"SFT_OPTIMIZER": "adamw-8bit", "SFT_ZERO_STAGE": "3-offload"},
     "SFT_OPTIMIZER='adamw-8bit': not with SFT_ZERO_STAGE=3-offload: offload runs DeepSpeed's CPU Adam"),
    ({"SFT_OPTIMIZER": "adamw", "SFT_ZERO_STAGE": "2-8bit"},
     "SFT_OPTIMIZER='adamw': not with SFT_ZERO_STAGE=2-8bit, whose state is 8-bit; use SFT_ZERO_STAGE=2 or "
     "SFT_OPTIMIZER=adamw-8bit"),
    ({"SFT_OPTIMIZER": "adamw-8bit", "SFT_TRAINER_ARGS": '{"optim": "adamw_torch"}'},
     "SFT_OPTIMIZER='adamw-8bit': not with an optim in SFT_TRAINER_ARGS: both name the optimizer"),
])
def test_the_optimizer_against_the_settings_that_also_name_it(isolated_env, environ, message):
    (problem,) = problems_of(environ)
    assert problem.startswith(message)


def test_the_optimizer_and_the_stage_name_one_option_together(isolated_env):
    assert problems_of({"SFT_OPTIMIZER": "adamw-8bit", "SFT_ZERO_STAGE": "2"}) == []
    assert problems_of({"SFT_ZERO_STAGE": "2-8bit"}) == []
