"""The user's own data through the whole job: entrypoint.py as a subprocess, two CPU ranks on gloo, real
DeepSpeed through the real launcher, on the demo model.

Every shape TRL trains on, each from a local file and a folder in one mixture, each loss mode, and
evaluation under every ZeRO stage (and offload):

    run       data (a mixture of a file and a folder)            loss        ZeRO              evaluation
    messages  .jsonl (a third with a system turn) + folder of      assistant   3                 10% held out
              .jsonl and .jsonl.gz
    conv_pc   .parquet + a .parquet folder x0.5                  completion  2 (unpacked)      SFT_EVAL_DATASET
                                                                                                 (Alpaca's columns)
    std_pc    .csv + a folder of train.csv and test.csv          auto        1                 the folder's test
    text      .json + a save_to_disk DatasetDict                 all         3-offload (unp.)  its test split

and a Hub dataset (SFT_DATASET_CONFIG, SFT_DATASET_REVISION, SFT_EVAL_SPLIT) and model (its main branch,
resolved to a commit) from the local Hub server (tests/hubserver/), whose model card records the commits.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, REPO, demo_env, read_summary, run_entrypoint
from data_fixtures import rows, save_to_disk, write

pytestmark = pytest.mark.slow

MARKED = DEMO_MODEL.parent / "chatml-assistant-mask.jinja"
STEPS, EVAL_EVERY = 4, 3  # evaluations at step 3 and, the last step not a multiple, at 4
JOB = dict(probe_steps=3, max_steps=STEPS, save_steps=STEPS, eval_steps=EVAL_EVERY, logging_steps=1, max_length=128,
           micro_batch=1, precision="fp32", learning_rate=2e-3, seed=0)


def local_runs(data: Path) -> dict[str, dict]:
    """The settings of each local run, its fixtures written under `data`."""
    write(data / "chat.jsonl", rows("messages", 120))
    for i in range(2):
        write(data / "chat-folder" / f"part-{i}.jsonl", rows("messages", 40))
    part = data / "chat-folder" / "part-1.jsonl"  # a folder may mix plain and compressed files of one format
    part.with_name("part-1.jsonl.gz").write_bytes(gzip.compress(part.read_bytes()))
    part.unlink()
    write(data / "pc.parquet", rows("conversational_pc", 80))
    write(data / "pc-folder" / "a.parquet", rows("conversational_pc", 60))
    write(data / "pc-eval.json", rows("alpaca", 12))  # Alpaca's columns are conversational prompt/completion
    write(data / "qa.csv", rows("standard_pc", 80))
    write(data / "qa-folder" / "train.csv", rows("standard_pc", 60))
    write(data / "qa-folder" / "test.csv", rows("standard_pc", 10))
    write(data / "text.json", rows("text", 70))
    save_to_disk(data / "text-saved", {"train": rows("text", 50), "test": rows("text", 9)})
    return {
        "messages": dict(dataset=f"{data / 'chat.jsonl'}, {data / 'chat-folder'}", loss_on="assistant",
                         chat_template=str(MARKED), zero_stage="3", eval_fraction=0.1),
        "conv_pc": dict(dataset=f"{data / 'pc.parquet'}, {data / 'pc-folder'}:0.5", loss_on="completion",
                        zero_stage="2", packing="false", eval_dataset=str(data / "pc-eval.json")),
        "std_pc": dict(dataset=f"{data / 'qa.csv'}, {data / 'qa-folder'}", zero_stage="1",
                       eval_dataset=str(data / "qa-folder"), eval_split="test"),
        "text": dict(dataset=f"{data / 'text.json'}, {data / 'text-saved'}", loss_on="all", zero_stage="3-offload",
                     packing="false", eval_dataset=str(data / "text-saved"), eval_split="test"),
    }


EXPECTED = {  # run: shape, loss on, training rows, evaluation rows
    "messages": ("conversational language modeling", "assistant", 180, 20),
    "conv_pc": ("conversational prompt-completion", "completion", 110, 12),
    "std_pc": ("standard prompt-completion", "completion", 140, 10),
    "text": ("standard language modeling", "all", 120, 9),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    data = tmp_path_factory.mktemp("data")
    done = {}
    for name, settings in local_runs(data).items():
        tmp = tmp_path_factory.mktemp(name)
        done[name] = (run_entrypoint(demo_env(tmp, **{**JOB, **settings})), tmp / "out")
    return done


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_shape_trains_and_evaluates(runs, name):
    result, out = runs[name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shape, loss_on, train_rows, eval_rows = EXPECTED[name]
    summary = read_summary(out)
    assert summary["status"] == "done" and summary["train"]["global_step"] == STEPS
    data = summary["data"]
    assert (data["shape"], data["loss_on"], data["train_rows"], data["eval_rows"]) == (shape, loss_on, train_rows,
                                                                                        eval_rows)
    assert summary["resolved"]["loss_on"] == loss_on and summary["decisions"]["loss"]
    assert f"data: SFT_DATASET: {shape}, " in result.stdout
    evals = [e for e in summary["train"]["log_history"] if "eval_loss" in e]
    assert [e["step"] for e in evals] == [EVAL_EVERY, STEPS]  # at SFT_EVAL_STEPS, and at the end
    # the probe (its 3 steps the training's first) timed its evaluation at step 3: the step's own log stays
    assert [e["step"] for e in summary["train"]["log_history"] if "loss" in e] == list(range(1, STEPS + 1))
    assert all(e["eval_loss"] > 0 and 0 <= e["eval_mean_token_accuracy"] <= 1 for e in evals)
    assert summary["eval"] == {"step": STEPS, "loss": evals[-1]["eval_loss"], "evaluations": 2,
                               "mean_token_accuracy": evals[-1]["eval_mean_token_accuracy"]}
    assert summary["train"]["eval_seconds"] > 0
    assert (out / "run" / "loss.png").stat().st_size > 0


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_probes_projection_counts_evaluation(runs, name):
    probe = json.loads((runs[name][1] / "run" / "probe.json").read_text())
    assert probe["eval_every"] == EVAL_EVERY and probe["eval_passes"] == 2  # step 3 and the end
    assert probe["eval_batches"] >= 1 and probe["eval_seconds_per_batch"] > 0
    steps_h = probe["total_steps"] * probe["seconds_per_step"] / 3600
    eval_h = probe["eval_passes"] * probe["eval_batches"] * probe["eval_seconds_per_batch"] / 3600
    assert probe["projected_hours"] == round(steps_h + eval_h, 3)
    assert probe["projected_eval_hours"] == round(eval_h, 3)


def test_final_is_saved_with_the_template_it_trained_with(runs):
    out = runs["messages"][1]
    assert (out / "final" / "chat_template.jinja").read_text() == MARKED.read_text()
    assert "loss: assistant turns only (SFT_LOSS_ON)" in runs["messages"][0].stdout


# -- a Hub dataset and model, at a config and revisions, from the local Hub server ---------------------


@pytest.fixture(scope="module")
def hub_run(tmp_path_factory):
    """The dataset alice/mix (configs chat and plain) and the model alice/tiny, each with two commits; the job
    pinned to the dataset's first and on the model's main branch (its second), uploading to alice/out."""
    from huggingface_hub import HfApi

    from hub_fixtures import client_env, configure_client, start_hub_process
    from hubserver import WRITE_TOKEN

    tmp = tmp_path_factory.mktemp("hub")
    hub = start_hub_process(tmp / "server")
    patch = pytest.MonkeyPatch()
    try:
        configure_client(patch, hub.url, tmp / "client")  # this process uploads the fixtures
        api = HfApi(endpoint=hub.url, token=WRITE_TOKEN)
        first_data = _dataset_repo(api, tmp / "mix")
        main_model = _model_repo(api, tmp / "tiny")
        env = demo_env(tmp, **{**JOB, "zero_stage": "2"})
        env.update(client_env(hub.url, tmp / "hf-home"), HF_TOKEN=WRITE_TOKEN, SFT_HUB_REPO="alice/out",
                   SFT_MODEL="alice/tiny", SFT_DATASET="alice/mix", SFT_DATASET_CONFIG="chat",
                   SFT_DATASET_REVISION=first_data, SFT_EVAL_SPLIT="test")
        result = run_entrypoint(env)
        card = api.hf_hub_download("alice/out", "README.md", cache_dir=tmp / "read") if result.returncode == 0 \
            else None
        yield result, tmp / "out", first_data, main_model, Path(card).read_text() if card else ""
    finally:
        patch.undo()
        hub.stop()


def _dataset_repo(api, folder: Path) -> str:
    """alice/mix: config chat (train, test) and plain; then a second commit changes the training rows."""
    api.create_repo("alice/mix", repo_type="dataset", private=True)
    (folder / "README.md").parent.mkdir(parents=True)
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: chat\n  data_files:\n  - split: train\n"
                                      "    path: chat/train.jsonl\n  - split: test\n    path: chat/test.jsonl\n"
                                      "- config_name: plain\n  data_files: plain/*.jsonl\n---\n")
    write(folder / "chat" / "train.jsonl", rows("messages", 60))
    write(folder / "chat" / "test.jsonl", rows("messages", 6))
    write(folder / "plain" / "a.jsonl", rows("text", 20))
    first = api.upload_folder(repo_id="alice/mix", repo_type="dataset", folder_path=str(folder)).oid
    write(folder / "chat" / "train.jsonl", rows("messages", 90))
    api.upload_folder(repo_id="alice/mix", repo_type="dataset", folder_path=str(folder))
    return first


def _model_repo(api, folder: Path) -> str:
    """alice/tiny: the demo model, then a second commit (its main) adding a README."""
    api.create_repo("alice/tiny", private=True)
    shutil.copytree(DEMO_MODEL, folder)
    api.upload_folder(repo_id="alice/tiny", folder_path=str(folder))
    (folder / "README.md").write_text("the tiny model\n")
    return api.upload_folder(repo_id="alice/tiny", folder_path=str(folder)).oid


def test_a_hub_dataset_and_model_at_their_revisions(hub_run):
    result, out, first_data, main_model, card = hub_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = read_summary(out)
    source = summary["data"]["train"][0]
    assert (source["path"], source["config"], source["revision"]) == ("alice/mix", "chat", first_data)
    assert summary["data"]["train_rows"] == 60 and summary["data"]["eval_rows"] == 6  # v1's rows, its test split
    assert summary["model_revision"] == main_model  # the branch the job found, as a commit
    assert summary["decisions"]["model"] == f"alice/tiny at commit {main_model} (its main branch at start)"
    assert summary["eval"]["evaluations"] == 2
    assert f"- base model commit: `{main_model}`" in card and f"`alice/mix` at commit `{first_data}`" in card
    assert f"evaluation (6 rows) at step {STEPS}: loss " in card and "token accuracy" in card


# -- bad data: exit 2 before any rank starts, nothing written ------------------------------------------


def test_a_100000_row_file_with_a_bad_last_row_fails_at_once(tmp_path):
    data = rows("messages", 100_000)
    data[-1]["messages"][-1]["role"] = "bot"
    path = write(tmp_path / "big.jsonl", data)
    env = demo_env(tmp_path, dataset=str(path))
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    seconds = time.monotonic() - started
    print(f"time to the error on a 100,000-row file: {seconds:.1f} s")
    assert result.returncode == 2, result.stdout[-3000:]
    assert f"SFT_DATASET: {path}: role bot in 'messages' of row 100000: a role must be one of" in result.stdout
    assert "torch.distributed.run" not in result.stdout and not (tmp_path / "out").exists()
    assert seconds < 180


@pytest.mark.slow
def test_a_larger_dataset_is_prepared_by_several_processes_in_the_controller_and_the_ranks(tmp_path):
    """2,048 rows (the demo's, four times): one process per 1,000 rows begun, 3, count them in the controller and
    tokenise and pack them in the ranks (TRL's dataset_num_proc). Before, both were one process below 20,000 rows,
    and 15,806 Capybara-like rows took about 45 s of one core twice before a GPU machine's first step."""
    data = tmp_path / "larger.jsonl"
    data.write_text(DEMO_DATA.read_text() * 4)
    env = demo_env(tmp_path, dataset=data, probe_steps=2)
    result = run_entrypoint(env, "probe")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    spec = json.loads((tmp_path / "out" / "run" / "spec-probe.json").read_text())
    assert spec["data"]["processes"] == 3
    # datasets names each process's share of a map's output "..._0000K_of_0000N.arrow", beside the dataset it maps:
    # the ranks' maps of the data step's tokens (their packing) ran in 3
    tokens = tmp_path / "out" / "run" / "tokens"
    shards = sorted(p.name for p in tokens.rglob("cache-*_of_00003.arrow"))
    assert len(shards) >= 3, sorted(p.name for p in tokens.rglob("*.arrow"))
    assert spec["data"]["tokens"] == str(tokens) and "data: tokens: 2,048 training rows tokenised in" in result.stdout
    assert read_summary(tmp_path / "out")["probe"]["steps_per_epoch"] > 0
