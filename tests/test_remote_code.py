"""A model's own code (sft/controller/remotecode.py): never run unasked. No library call can ask on stdin (the
entrypoint closes it, and every call passes trust_remote_code), a model that needs its code is refused naming
SFT_TRUST_REMOTE_CODE, and with it the code runs on purpose, said in the decision and the model card."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_MODEL, REPO, demo_env
from sft.controller import inputs, prepare, remotecode
from sft.settings import Settings

PROMPT = "Do you wish to run the custom code"


def custom_model(tmp_path: Path, model_type: str = "sftcustom") -> tuple[Path, Path]:
    """The demo model, its config mapped to code of its own (auto_map) for a type transformers does not know; the
    code leaves a file when it runs. (folder, that file)"""
    folder, ran = tmp_path / "custom-model", tmp_path / "the-models-code-ran"
    shutil.copytree(DEMO_MODEL, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type=model_type, architectures=["CustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "configuration_custom.py").write_text(
        f"open({str(ran)!r}, 'a').write('config\\n')\nfrom transformers import Qwen3Config\n\n\n"
        f"class CustomConfig(Qwen3Config):\n    model_type = {model_type!r}\n")
    (folder / "modeling_custom.py").write_text(
        f"open({str(ran)!r}, 'a').write('model\\n')\nfrom transformers import Qwen3ForCausalLM\n\n"
        "from .configuration_custom import CustomConfig\n\n\nclass CustomForCausalLM(Qwen3ForCausalLM):\n"
        "    config_class = CustomConfig\n")
    return folder, ran


def test_what_the_model_maps_to_its_own_code_is_found_from_its_json(tmp_path):
    folder, ran = custom_model(tmp_path)
    found = remotecode.found(str(folder))
    assert [(c.auto, c.target, c.needed) for c in found] == [
        ("AutoConfig", "configuration_custom.CustomConfig", True),
        ("AutoModelForCausalLM", "modeling_custom.CustomForCausalLM", True)]
    assert remotecode.found(str(DEMO_MODEL)) == []
    assert not ran.exists()


def test_a_known_type_with_an_auto_map_needs_no_code(tmp_path):
    folder, _ = custom_model(tmp_path, model_type="qwen3")
    assert [c.needed for c in remotecode.found(str(folder))] == [False, False]
    assert inputs.model_code(Settings(model=str(folder))) == []


@pytest.mark.parametrize("model_type,needed", [("sftcustom", True), ("qwen3", False)])
def test_a_tokenizer_of_its_own_code_is_found(tmp_path, model_type, needed):
    """Needed as transformers decides: where it has no tokenizer for the model's type nor the class named."""
    folder, _ = custom_model(tmp_path, model_type)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="SftCustomTokenizer", auto_map={"AutoTokenizer": [None, "tok.SftCustomTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    found = remotecode.found(str(folder))[-1]
    assert (found.auto, found.target, found.needed) == ("AutoTokenizer", "tok.SftCustomTokenizer", needed)


def test_a_model_that_needs_its_code_is_refused_naming_the_setting(isolated_env, tmp_path):
    folder, ran = custom_model(tmp_path)
    env = {"SFT_MODEL": str(folder), "SFT_OUTPUT_DIR": str(tmp_path / "out")}
    found = prepare.checked(inputs.CONFIG, gpus=(), environ=env).problems
    assert len(found) == 1 and found[0].startswith(f"SFT_MODEL={str(folder)!r}: needs its own code to load "
                                                   "(AutoConfig -> configuration_custom.CustomConfig; ")
    assert "set SFT_TRUST_REMOTE_CODE=true to run it" in found[0]
    assert not ran.exists()


def run(env: dict[str, str], *args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "entrypoint.py"), *args], env=env, cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["config", "run"])
def test_a_yes_on_stdin_runs_nothing_and_no_question_is_asked(tmp_path, command):
    """Issue 46: transformers asked "run the custom code? [y/N]" inside the batch job, and a `y` ran the model's
    code in the controller."""
    folder, ran = custom_model(tmp_path)
    done = run(demo_env(tmp_path, model=folder), command, stdin="y\ny\ny\n")
    assert done.returncode == 2, done.stderr[-3000:]
    assert PROMPT not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert "SFT_TRUST_REMOTE_CODE=true" in done.stderr
    assert not ran.exists() and not (tmp_path / "out").exists()


def test_with_consent_the_code_runs_and_the_decision_says_so(tmp_path):
    folder, ran = custom_model(tmp_path)
    done = run(demo_env(tmp_path, model=folder, trust_remote_code="true"), "config", stdin="")
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout)
    assert shown["reasons"]["remote_code"] == (
        "SFT_TRUST_REMOTE_CODE=true: the model's own code runs in the controller and every rank, trusted on purpose "
        "(AutoConfig -> configuration_custom.CustomConfig; AutoModelForCausalLM -> modeling_custom.CustomForCausalLM)")
    assert shown["trainer"]["trust_remote_code"] is True  # TRL passes it to the model's and tokenizer's loading
    assert {"config", "model"} <= set(ran.read_text().split())  # run on purpose


def test_the_model_card_says_the_code_was_trusted():
    from sft.hub.modelcard import model_card

    summary = {"settings": {"model": "org/custom", "trust_remote_code": True},
               "decisions": {"remote_code": "SFT_TRUST_REMOTE_CODE=true: the model's own code runs (AutoConfig -> a.B)"}}
    card = model_card(summary, "you/custom-sft")
    assert "- remote code: SFT_TRUST_REMOTE_CODE=true: the model's own code runs (AutoConfig -> a.B); loading this " \
           "model needs `trust_remote_code=True` as well" in card
    assert "remote code" not in model_card({"settings": {"model": "org/plain"}}, "you/plain-sft")
