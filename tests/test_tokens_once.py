"""Tokenise once: the data step's tokens kept in OUTPUT/run/tokens/, trained on by the ranks and reused by a
restart (sft/data/cache.py); made again when the rows, the tokenizer or the labels change; and the rows SFTTrainer
prepares from them, and so the losses, the same as from its own tokenisation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, REPO, demo_env, read_summary, run_entrypoint, step_losses, tmpfs
from sft import exitcodes
from sft.controller import data as data_step
from sft.controller import tokens as tokens_step
from sft.data import cache
from sft.data.sources import build
from sft.data.tokens import Labeller
from sft.handoff import RankReport, RunSpec
from sft.planner import data as data_rules
from sft.planner.inputs import Ranks
from sft.settings import Settings

JOB = dict(max_length=64, micro_batch=1, grad_accum=1, max_steps=6, logging_steps=1, precision="fp32", seed=0,
           zero_stage="2", save_steps=100, probe_steps=0)
TEMPLATE = REPO / "demo" / "chatml-assistant-mask.jinja"


def _mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if not p.name.startswith("cache-")}


@pytest.fixture(scope="module")
def starts(tmp_path_factory) -> dict:
    """Two starts on one folder: the first makes and keeps the tokens and ends before training (a probe with no
    probe steps), the second trains on them."""
    tmp = tmp_path_factory.mktemp("tokens")
    env = demo_env(tmp, **JOB)
    first = run_entrypoint(env, "probe")
    folder = tmp / "out" / "run" / cache.FOLDER
    made = _mtimes(folder) if folder.is_dir() else {}
    second = run_entrypoint(env)
    return {"first": first, "second": second, "out": tmp / "out", "made": made, "tmp": tmp}


def test_the_first_start_tokenises_and_keeps_the_tokens(starts):
    first = starts["first"]
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "data: tokens: 512 training rows tokenised in " in first.stdout
    assert f"data: tokens kept in {starts['out'] / 'run' / 'tokens'} for the ranks and later starts" in first.stdout
    assert {"key.json", "state.json", "dataset_info.json"} <= set(starts["made"])


def test_a_second_start_reuses_them_unchanged_and_the_ranks_train_on_them(starts):
    second, out = starts["second"], starts["out"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "data: tokens: the 512 training rows' tokens reused from " in second.stdout
    assert "tokenised in" not in second.stdout and "Tokenizing train dataset" not in second.stderr
    assert _mtimes(out / "run" / "tokens") == starts["made"]  # read, not written again
    summary = read_summary(out)
    assert summary["data"]["tokens"]["reused"] is True and summary["data"]["tokens"]["rows"] == 512
    spec = RunSpec.load(out / "run" / "spec-train.json")
    assert spec.data.tokens == str(out / "run" / "tokens")


def test_the_losses_are_those_of_trls_own_tokenisation(starts, tmp_path):
    """The second start's training launch run again by the real launcher with no tokens in its spec: the ranks
    tokenise the rows themselves, as before (TRL's SFTTrainer), and every step's loss and token count is the same."""
    out = starts["out"]
    spec = json.loads((out / "run" / "spec-train.json").read_text())
    mine = tmp_path / "own"
    spec["data"]["tokens"] = ""
    spec["trainer"]["output_dir"] = str(mine)
    spec.update(report_dir=str(mine / "reports"), stop_file=str(mine / "STOP"), final_dir=str(mine / "final"),
                run_dir=str(mine / "run"))
    (mine / "run").mkdir(parents=True)
    path = mine / "spec.json"
    path.write_text(json.dumps(spec))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**demo_env(starts["tmp"], **JOB), "PYTHONPATH": str(REPO)}
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                          f"--master-port={port}", "-m", "sft.ranks.train", str(path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "Tokenizing train dataset" in ran.stderr  # they did tokenise, this time
    own = RankReport.load(RankReport.path(mine / "reports", "train", 0))
    reference = step_losses(read_summary(out))
    assert len(reference) == JOB["max_steps"]
    assert {e["step"]: e["loss"] for e in own.log_history if "loss" in e} == reference
    assert own.num_tokens == read_summary(out)["train"]["num_tokens"]


@pytest.fixture
def kept(isolated_env, tmp_path):
    """The demo's tokens made by the data step and kept, as the job keeps them; a copy of the demo's data to change."""
    data = tmp_path / "chat.jsonl"
    data.write_text(DEMO_DATA.read_text())
    s = _settings(tmp_path, dataset=str(data))
    found = data_step.read(s, Ranks(1, ()))
    assert found.tokens is not None and not found.tokens.reused
    tokens_step.keep(found.tokens)
    return tmp_path, data


def _settings(tmp_path: Path, **changes) -> Settings:
    base = dict(model=str(DEMO_MODEL), dataset=str(DEMO_DATA), output_dir=str(tmp_path / "out"), max_length=64,
                micro_batch=1)
    return Settings(**{**base, **changes})


def _reused(tmp_path: Path, **changes) -> bool:
    found = data_step.read(_settings(tmp_path, **changes), Ranks(1, ()))
    return found.tokens.reused


def test_the_same_rows_reuse_them_and_a_new_length_cuts_them_anew(kept):
    tmp_path, data = kept
    assert _reused(tmp_path, dataset=str(data))
    # kept before truncation: another SFT_MAX_LENGTH, packing or long-row policy reads the same tokens
    assert _reused(tmp_path, dataset=str(data), max_length=32, packing=False, long_rows="drop")


def test_changed_rows_a_new_template_or_loss_make_them_again(kept):
    tmp_path, data = kept
    assert not _reused(tmp_path, dataset=str(data), chat_template=str(TEMPLATE))
    assert not _reused(tmp_path, dataset=str(data), chat_template=str(TEMPLATE), loss_on="assistant")
    assert not _reused(tmp_path, dataset=str(data), eval_fraction=0.1)  # other training rows
    lines = data.read_text().splitlines()
    row = json.loads(lines[0])
    row["messages"][-1]["content"] += " And more."
    stamp = data.stat().st_mtime_ns
    data.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    os.utime(data, ns=(stamp, stamp))  # the same modification time: datasets' fingerprint alone would not see it
    assert not _reused(tmp_path, dataset=str(data))


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("extra", [{}, {"long_rows": "drop", "eval_fraction": 0.1}])
def test_sfttrainer_prepares_the_same_rows_from_the_tokens_as_from_the_rows(isolated_env, tmp_path, packing, extra):
    """What the ranks hand SFTTrainer (sources.build, with the data step's tokens and without), prepared by TRL's own
    _prepare_dataset with the ranks' arguments: the same rows, tokens and labels, in the same order."""
    s = _settings(tmp_path, packing=packing, **extra)
    found = data_step.read(s, Ranks(1, ()))
    plan, _ = data_rules.plan(s, found.facts)
    tokens = tokens_step.keep(found.tokens)
    labeller = Labeller(found.tokenizer, found.loss_on, s.max_length, {"dataset_num_proc": plan.processes})
    from_rows, eval_rows = build(plan)
    from_tokens, eval_tokens = build(_with(plan, tokens))
    assert from_tokens.column_names == ["input_ids", "labels"] and len(from_tokens) == len(from_rows)
    assert (eval_tokens is None and eval_rows is None) or eval_tokens["messages"] == eval_rows["messages"]
    theirs, ours = labeller.prepare(from_rows, packing), labeller.prepare(from_tokens, packing)
    columns = ["input_ids", "labels", *(["seq_lengths"] if packing else [])]
    assert ours.select_columns(columns).to_dict() == theirs.select_columns(columns).to_dict()


def test_assistant_only_loss_rows_go_to_sfttrainer_untokenised(isolated_env, tmp_path):
    """TRL refuses assistant_only_loss on rows already tokenised ("the dataset is not conversational"): with
    SFT_LOSS_ON=assistant the ranks get the rows themselves, tokens kept or not."""
    s = _settings(tmp_path, loss_on="assistant", chat_template=str(TEMPLATE))
    found = data_step.read(s, Ranks(1, ()))
    plan, _ = data_rules.plan(s, found.facts)
    from_tokens, _ = build(_with(plan, tokens_step.keep(found.tokens)))
    assert "input_ids" not in from_tokens.column_names
    assert from_tokens.to_dict() == build(plan)[0].to_dict()


def _with(plan, tokens: str):
    import dataclasses

    return dataclasses.replace(plan, tokens=tokens)


def test_a_disk_too_small_for_the_tokens_stops_naming_their_size_and_keeps_no_part(tmp_path):
    """The output folder's disk fills while the tokens are kept (before the checkpoint preflight, which sees them
    already written): exit 3 naming the tokens' size and the room, and no half-written tokens folder left."""
    with tmpfs(tmp_path / "disk", "200k") as small:  # the demo's tokens take about 0.3 MB
        out = small / "out"
        result = run_entrypoint({**demo_env(tmp_path, **JOB), "SFT_OUTPUT_DIR": str(out)})
        assert result.returncode == exitcodes.PREFLIGHT, result.stdout[-3000:] + result.stderr[-3000:]
        assert f"error: cannot write in {out} (No space left on device: the tokenised rows take 0.3 MB" in result.stdout
        assert "Traceback" not in result.stdout + result.stderr
        assert sorted(p.name for p in (out / "run").iterdir()) == ["heartbeat", "job.lock", "settings.json"]


def test_a_killed_processs_staging_folder_goes_at_the_next_start_a_running_ones_stays(tmp_path):
    """The data step's private folder (cache.staging) is removed at exit; kill -9 runs no exit handler, and a
    restarted container keeps its /tmp. The next start removes a folder whose lock nobody holds, never a running
    process's, nor one without a lock file (an older version's)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    made = "from sft.data import cache; import sys, time; print(cache.staging(), flush=True); time.sleep(600)"
    running, killed = (subprocess.Popen([sys.executable, "-c", made], env=env, stdout=subprocess.PIPE, text=True)
                       for _ in range(2))
    try:
        folders = [Path(p.stdout.readline().strip()) for p in (running, killed)]
        killed.kill()
        killed.wait(30)
        older = tmp_path / f"{cache.STAGING}older-version"  # no lock file: whose it is cannot be told
        older.mkdir()
        assert all(f.is_dir() for f in folders)
        new = subprocess.run([sys.executable, "-c", "from sft.data import cache; print(cache.staging())"], env=env,
                             capture_output=True, text=True, timeout=120, check=True)
        assert folders[0].is_dir() and (folders[0] / cache.HELD).is_file()  # its process runs
        assert not folders[1].exists()  # killed: removed
        assert older.is_dir()
        assert not Path(new.stdout.strip()).exists()  # that start ended normally: its own went at its exit
    finally:
        running.kill()
        running.wait(30)
