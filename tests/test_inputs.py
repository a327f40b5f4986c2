"""The start's checks of what the settings name, reported with the settings' own problems, all at once, exit 2,
before anything is written: a model folder's files, a DeepSpeed file by DeepSpeed's own config model, the
GPUs SFT_GPUS names, the token SFT_HUB_REPO needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, clean_environ, run_entrypoint
from sft.controller import inputs, machine, prepare
from sft.planner.inputs import GPU, Machine
from sft.settings import Settings

GIB = 2**30
SHIPPED_ZERO2 = json.loads((Path(__file__).resolve().parent.parent / "ds_configs" / "zero2.json").read_text())


def model_without(tmp_path: Path, *names: str) -> Path:
    """The demo model's folder without the files named."""
    folder = tmp_path / "model"
    shutil.copytree(DEMO_MODEL, folder)
    for name in names:
        (folder / name).unlink()
    return folder


def ds_file(tmp_path: Path, **changes) -> Path:
    """The shipped ZeRO-2 file with top-level keys changed (zero_optimization: merged)."""
    config = json.loads(json.dumps(SHIPPED_ZERO2))
    for key, value in changes.items():
        if key == "zero" and isinstance(value, dict):
            config["zero_optimization"].update(value)
        else:
            config["zero_optimization" if key == "zero" else key] = value
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return path


def test_every_problem_at_once_before_anything_is_written(tmp_path):
    """Before: a parse error hid every other problem (SFT_MICRO_BATCH=0 SFT_MODEL=/nonexistent named only the
    micro-batch); the DeepSpeed file, the tokenizer and the token were found by the ranks or not at all."""
    out = tmp_path / "out"
    env = clean_environ(tmp_path)
    env.update(SFT_MICRO_BATCH="0", SFT_MODEL=str(model_without(tmp_path, "tokenizer.json")),
               SFT_DATASET="/nonexistent.jsonl", SFT_DS_CONFIG=str(ds_file(tmp_path, zero={"stage": "two"})),
               SFT_TRAINER_ARGS='{"torch_compiled": true}', SFT_HUB_REPO="alice/run", SFT_OUTPUT_DIR=str(out))
    result = run_entrypoint(env)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert lines[0] == "error: the settings are not valid; nothing was started:"
    problems = [line[4:] for line in lines if line.startswith("  - ")]
    expected = ["SFT_MICRO_BATCH='0': expected at least 1", "SFT_DATASET='/nonexistent.jsonl': no such file",
                "SFT_TRAINER_ARGS=", "torch_compiled: unknown argument (did you mean torch_compile?)",
                "zero_optimization.stage='two': Input should be 0, 1, 2, 3",
                "no tokenizer.json, and AutoTokenizer finds no other tokenizer files (the folder holds: chat_template"
                ".jinja, config.json, generation_config.json, model.safetensors, tokenizer_config.json)",
                "needs HF_TOKEN",
                "HF_HUB_OFFLINE=1 forbids the Hub"]
    for words in expected:
        assert any(words in p for p in problems), (words, problems)
    assert len(problems) == 7  # one each, the DeepSpeed file's one key once
    assert not out.exists() and "Traceback" not in result.stderr


@pytest.mark.parametrize("changes,named", [
    ({"zero": {"stage": "two"}}, "zero_optimization.stage='two': Input should be 0, 1, 2, 3"),
    ({"zero": 5}, "zero_optimization=5: expected a JSON object (a section)"),
    ({"gradient_accumulation_steps": "lots"}, "gradient_accumulation_steps='lots': DeepSpeed refuses it"),
    ({"zero": {"offload_optimizer": {"device": "gpu"}}},
     "zero_optimization.offload_optimizer.device='gpu': Input should be 'none', 'cpu' or 'nvme'"),
    ({"zero": {"stage3_prefetch": 10}}, "zero_optimization.stage3_prefetch=10: Extra inputs are not permitted"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}},
     "the file as a whole: DeepSpeed refuses it (AssertionError: bfloat16 and fp16 modes cannot be simultaneously"),
    # ZeRO-3 without the weights gathered for save_model: final/ was DeepSpeed's shards, no weights from_pretrained
    # loads (found on CPU ranks: no model.safetensors in it)
    ({"zero": {"stage": 3}}, "zero_optimization.stage3_gather_16bit_weights_on_model_save is left out (DeepSpeed's "
                             "default: false): at ZeRO-3 the final model would then be DeepSpeed's shards"),
    ({"zero": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": False}},
     "zero_optimization.stage3_gather_16bit_weights_on_model_save=False: at ZeRO-3 the final model"),
])
def test_a_deepspeed_file_with_wrong_types_names_the_key(isolated_env, tmp_path, changes, named):
    """Before: the ranks died 25-44 s in with pydantic's errors, or the controller with an AttributeError."""
    path = ds_file(tmp_path, **changes)
    (problem,) = inputs.ds_file(Settings(ds_config=str(path)))
    assert problem.startswith(f"SFT_DS_CONFIG={str(path)!r}: ") and named in problem, problem


def test_every_bad_key_of_a_deepspeed_file_at_once(isolated_env, tmp_path):
    path = ds_file(tmp_path, zero={"stage": "two"}, gradient_accumulation_steps="lots", bf16=True)
    found = inputs.ds_file(Settings(ds_config=str(path)))
    assert [p.split(": ")[1].split("=")[0] for p in found] == ["bf16", "zero_optimization.stage",
                                                                "gradient_accumulation_steps"]


def test_the_shipped_and_the_seeds_deepspeed_files_pass(isolated_env):
    from conftest import REPO

    for path in sorted((REPO / "ds_configs").glob("*.json")):
        assert inputs.ds_file(Settings(ds_config=str(path))) == [], path


def test_a_model_folder_without_tokenizer_files_names_them(isolated_env, tmp_path):
    """Before: AutoTokenizer gave an empty tokenizer and 78 s later the ranks failed on 'chat_template is not set'."""
    folder = model_without(tmp_path, "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    s = Settings(model=str(folder))
    (problem,) = inputs.model_tokenizer(s)
    assert problem.startswith(f"SFT_MODEL={str(folder)!r}: no tokenizer in the folder (missing tokenizer.json, or "
                              "merges.txt and vocab.json (Qwen2Tokenizer))")
    assert inputs.model_tokenizer(Settings(model=str(DEMO_MODEL))) == []
    assert inputs.model_tokenizer(Settings(model="Qwen/Qwen3-8B")) == []  # a Hub name brings its own


def test_a_model_folder_without_a_chat_template_is_refused_for_conversations_only(isolated_env, tmp_path):
    """A settings problem once, whatever the data: text rows need no template, and SFT_CHAT_TEMPLATE may bring one
    (tests/test_other_models.py); the data step names it where the rows are conversations."""
    from sft.controller import data as data_step
    from sft.data import DataError
    from sft.planner.inputs import Ranks

    folder = model_without(tmp_path, "chat_template.jinja")
    s = Settings(model=str(folder), dataset=str(DEMO_DATA), output_dir=str(tmp_path / "out"), max_length=128,
                 micro_batch=1)
    assert inputs.problems(s, inputs.CONFIG) == []
    with pytest.raises(DataError) as e:
        data_step.read(s, Ranks(2, ()))
    assert e.value.problems == [f"SFT_MODEL={str(folder)!r}: its tokenizer has no chat template, and the data is "
                                "conversational language modeling: set SFT_CHAT_TEMPLATE to a .jinja file or a model "
                                "to take the template from"]


def test_sft_gpus_naming_gpus_that_are_not_there_is_a_problem_reported_with_the_others():
    two = Machine(gpus=(GPU("NVIDIA H200", 140 * GIB),) * 2)
    (problem,) = prepare.ranks(Settings(gpus="0,5"), two)[1]
    assert problem == "SFT_GPUS='0,5': this machine shows 2 GPU(s) (0-1); no GPU 5"
    assert prepare.ranks(Settings(gpus="1", precision="bf16"), two)[1] == []
    assert prepare.ranks(Settings(gpus="0,5"), Machine())[1] == []  # no GPU: ignored, the decision's reason says so


def test_bf16_on_a_machine_without_gpu(isolated_env):
    """Before: SFT_PRECISION=bf16 on CPU passed, and every rank died with the Trainer's 'Your setup doesn't
    support bf16/gpu'."""
    (problem,) = prepare.ranks(Settings(precision="bf16"), Machine())[1]
    assert problem.startswith("SFT_PRECISION='bf16': this machine has no GPU")
    import torch

    if not torch.cuda.is_available():  # this machine, measured
        here = Machine(gpus=machine.gpus())
        assert prepare.ranks(Settings(precision="bf16", gpus="5"), here)[1] == [problem]
        assert prepare.ranks(Settings(gpus="5"), here)[1] == []


def test_the_token_is_checked_on_node_0_only(isolated_env, monkeypatch):
    s = Settings(hub_repo="alice/run")
    assert inputs.hub_token(Settings()) == []
    assert inputs.hub_token(s) == ["SFT_HUB_REPO='alice/run' needs HF_TOKEN: a Hugging Face token with write access "
                                   "(https://huggingface.co/settings/tokens)"]
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijkl")
    assert inputs.hub_token(s) == []
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert inputs.hub_token(s) == []  # node 1 never uploads


def test_config_of_a_model_folder_without_a_tokenizer_stops_at_once(tmp_path):
    env = clean_environ(tmp_path)
    env.update(SFT_MODEL=str(model_without(tmp_path, "tokenizer.json")), SFT_DATASET=str(DEMO_DATA))
    result = run_entrypoint(env, "config")
    assert result.returncode == 2 and "no tokenizer.json, and AutoTokenizer finds no other" in result.stderr
    assert result.stdout == ""


def test_data_of_a_model_folder_without_a_tokenizer_names_the_tokenizer_not_the_template(tmp_path):
    """Before: `data` loaded the empty tokenizer AutoTokenizer gives and said the chat template renders every row as no
    token at all (fix the template)."""
    env = clean_environ(tmp_path)
    env.update(SFT_MODEL=str(model_without(tmp_path, "tokenizer.json", "tokenizer_config.json")),
               SFT_DATASET=str(DEMO_DATA))
    result = run_entrypoint(env, "data")
    assert result.returncode == 2 and "no tokenizer in the folder (missing tokenizer.json" in result.stderr
    assert "chat template" not in result.stderr and result.stdout == ""


def test_a_model_folder_whose_config_is_not_json_is_named_once_with_its_fix(tmp_path):
    """Before: config said it twice, once as the tokenizer's ('copy the tokenizer files'), with the network's fix, and
    data said the tokenizer's alone."""
    folder = model_without(tmp_path)
    (folder / "config.json").write_text('{"model_type": "qwen3", ')
    env = clean_environ(tmp_path)
    env.update(SFT_MODEL=str(folder), SFT_DATASET=str(DEMO_DATA))
    for command in ("config", "data"):
        result = run_entrypoint(env, command)
        problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
        assert result.returncode == 2 and len(problems) == 1, result.stderr[-2000:]
        assert problems[0].startswith(f"  - SFT_MODEL={str(folder)!r}: cannot read its config.json (")
        assert problems[0].endswith("): copy it again from the model it came from")
    # a Hub model's config is named by the data step, with the data's problems
    env.update(SFT_MODEL="Qwen/Qwen3-8B", SFT_DATASET="trl-lib/Capybara")
    result = run_entrypoint(env, "data")
    assert result.returncode == 2 and "error: the data is not valid" in result.stderr, result.stderr[-2000:]
    assert "SFT_DATASET: trl-lib/Capybara" in result.stderr and "SFT_MODEL='Qwen/Qwen3-8B'" in result.stderr
