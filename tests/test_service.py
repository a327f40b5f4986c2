"""The job run like a service, end to end: entrypoint.py as a subprocess on two CPU ranks, against the local Hub
server in its own process (the real huggingface_hub client over HTTP to 127.0.0.1):

    tracked   a whole run from a model on the (local) Hub, logging to TensorBoard and trackio, its token in
              a file (HF_TOKEN_PATH, no HF_TOKEN): the trackers' losses, run/events.jsonl, timestamps on every
              controller line, `status`, the model at the repo's root loaded back by from_pretrained and
              `hf download`, the model card; also the reference losses of the time-limit test
    limited   the same run on a slower machine (SFTTEST_STEP_SECONDS) with SLURM's end time mid-run, uploading to
              a branch (SFT_HUB_REVISION): it saves and uploads a checkpoint before the limit and exits 75
    resumed   a new start of it on an empty disk: it resumes from the branch and ends with the losses of `tracked`
    refused / truncated   the budget gate with a price that makes SFT_MAX_COST bite
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from conftest import DEMO_MODEL, REPO, demo_env, read_summary, step_losses
from hub_fixtures import HubProcess, client_env, start_hub_process
from hubserver import RepoStore

from sft import checkpoints, exitcodes
from sft.events import (CheckpointSaved, Ended, Evaluated, HubBehind, SettingsResolved, StopRequested,
                        TrainStarted, UploadFinished, UploadStarted, read_events)
from sft.hub.layout import MANIFEST, hub_checkpoints

pytestmark = pytest.mark.slow

TOKEN = "hf_FAKE-service-secret-Wq3Zr5Xt9Ks2LmPd7Nb4"  # searched for in every file and line at the end
MODEL_REPO = "alice/tiny-qwen3"  # the demo model, served by the local Hub: the card links it as the base model
EPOCHS = 3  # 174 steps: long enough for a time limit to fall inside training on a slowed machine
STEPS_PER_EPOCH = 64 - 6  # the demo's 64 rows, 6 of them (SFT_EVAL_FRACTION=0.1) held out for evaluation
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
JOB = dict(zero_stage="2", precision="fp32", seed=0, learning_rate=2e-3, logging_steps=1, probe_steps=0,
           save_steps=8, save_total_limit=2, upload_minutes=0.02, packing="false", epochs=EPOCHS,
           eval_fraction=0.1, eval_steps=32)  # every run evaluates on the same held-out rows, so losses compare
SLOW_STEP_S = 0.5  # SFTTEST_STEP_SECONDS of the time-limit run: 174 steps take at least 87 s
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")
SCANNED: list[Path] = []
OUTPUTS: list[str] = []


@dataclass
class Run:
    code: int
    output: str
    out: Path
    started: float  # wall clock
    seconds: float


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> HubProcess:
    root = tmp_path_factory.mktemp("hub")
    SCANNED.append(root)
    process = start_hub_process(root)
    process.add_token(TOKEN, "alice", "write")
    process.store = RepoStore(root)
    _publish_demo_model(process)
    yield process
    process.stop()


def _publish_demo_model(hub: HubProcess) -> None:
    from huggingface_hub import HfApi, constants

    api = HfApi(endpoint=hub.url, token=TOKEN)
    api.create_repo(MODEL_REPO, private=False)
    with pytest.MonkeyPatch.context() as patch:  # the local Hub speaks LFS, not Xet (tests/hubserver/__init__.py)
        patch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        api.upload_folder(repo_id=MODEL_REPO, folder_path=str(DEMO_MODEL), commit_message="the demo model")


def env_for(hub: HubProcess, tmp: Path, repo: str | None, token_in_file: bool = False, **settings) -> dict[str, str]:
    SCANNED.append(tmp)
    env = demo_env(tmp, **{**JOB, **settings})
    env.update(client_env(hub.url, tmp / "hf-home"), SFT_MODEL=MODEL_REPO)
    if repo:
        env["SFT_HUB_REPO"] = repo
    if token_in_file:  # huggingface_hub's own lookup finds it there (as after `hf auth login`)
        (tmp / "token").write_text(TOKEN)
        env["HF_TOKEN_PATH"] = str(tmp / "token")
    else:
        env["HF_TOKEN"] = TOKEN
    return env


def run_job(env: dict[str, str], timeout: float = 600) -> Run:
    started, t0 = time.time(), time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=timeout, check=False)
    OUTPUTS.extend([result.stdout, result.stderr])
    return Run(result.returncode, result.stdout + result.stderr, Path(env["SFT_OUTPUT_DIR"]), started,
               time.monotonic() - t0)


def entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(REPO / "entrypoint.py"), *args], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
    OUTPUTS.extend([result.stdout, result.stderr])
    return result


def events(out: Path) -> list:
    return [e for _, e in read_events(out / "run" / "events.jsonl")]


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def head_files(hub: HubProcess, repo: str, branch: str = "main") -> dict[str, dict]:
    return hub.store.files("models", repo, branch)[1]


# --------------------------------------------------------------------------------------------
# A whole run, tracked, from a model on the Hub to the model on the Hub
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracked(hub, tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("tracked")
    settings = dict(report_to="tensorboard,trackio", run_name="svc-run")
    run = run_job(env_for(hub, tmp, "alice/svc", token_in_file=True, **settings))
    assert run.code == 0, run.output[-4000:]
    return run


def test_tensorboard_and_trackio_hold_the_runs_losses(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses = step_losses(read_summary(tracked.out))
    assert len(losses) == TOTAL_STEPS
    board = EventAccumulator(str(tracked.out / "run" / "tensorboard"))
    board.Reload()
    logged = {e.step: e.value for e in board.Scalars("train/loss")}
    assert logged.keys() == losses.keys() and max(abs(logged[k] - losses[k]) for k in losses) < 1e-5
    script = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
              "print(json.dumps(S.get_logs('huggingface', 'svc-run')))")  # trackio reads TRACKIO_DIR at import
    env = {**os.environ, "TRACKIO_DIR": str(tracked.out / "run" / "trackio")}
    rows = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    tracked_losses = {r["train/global_step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert tracked_losses.keys() == losses.keys() and max(abs(tracked_losses[k] - losses[k]) for k in losses) < 1e-5


def test_tensorboard_and_trackio_hold_the_eval_loss(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    evals = {e["step"]: e["eval_loss"] for e in read_summary(tracked.out)["train"]["log_history"] if "eval_loss" in e}
    if not evals:
        pytest.skip("the job does not evaluate yet (SFT_EVAL_* come with the data issue): no eval loss to read back")
    board = EventAccumulator(str(tracked.out / "run" / "tensorboard"))
    board.Reload()
    assert {e.step: e.value for e in board.Scalars("eval/loss")} == pytest.approx(evals)
    script = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
              "print(json.dumps(S.get_logs('huggingface', 'svc-run')))")
    env = {**os.environ, "TRACKIO_DIR": str(tracked.out / "run" / "trackio")}
    rows = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                     check=True).stdout)
    assert {r["train/global_step"]: r["eval/loss"] for r in rows if "eval/loss" in r} == pytest.approx(evals)
    assert any(isinstance(e, Evaluated) for e in events(tracked.out))


def test_events_tell_the_run_in_order_with_utc_times(tracked):
    lines = (tracked.out / "run" / "events.jsonl").read_text().splitlines()
    raw = [json.loads(line) for line in lines]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["time"]) for r in raw)
    times = [when(r["time"]) for r in raw]
    assert times == sorted(times) and tracked.started - 2 <= times[0] and times[-1] <= time.time()
    kinds = [r["event"] for r in raw]
    assert kinds[:3] == ["settings", "decided", "train_started"] and kinds[-1] == "end"
    found = events(tracked.out)
    assert isinstance(found[0], SettingsResolved) and found[0].settings["report_to"] == "tensorboard,trackio"
    saved = [e for e in found if isinstance(e, CheckpointSaved)]
    every_8 = sorted({*range(8, TOTAL_STEPS + 1, 8), TOTAL_STEPS})  # SFT_SAVE_STEPS=8, and the Trainer's at the end
    assert [e.step for e in saved] == every_8 and all(e.seconds > 0 for e in saved)
    started = [e for e in found if isinstance(e, UploadStarted)]
    finished = [e for e in found if isinstance(e, UploadFinished)]
    assert started and len(finished) == len(started) and all(e.ok and e.bytes > 0 and e.seconds > 0 for e in finished)
    assert finished[-1].folder == "final"
    assert any(isinstance(e, HubBehind) for e in found)
    assert found[-1] == Ended(status="done", exit_code=0)


def test_every_line_the_controller_prints_carries_its_time(tracked):
    ours = [line for line in tracked.output.splitlines() if re.search(
        r"(hub: |decided:|preflight:|train: ZeRO|upload: |done: exit code|\$ .*torch.distributed.run)", line)
        and "it/s]" not in line]  # the Trainer's progress bar shares a line with whatever follows it
    assert len(ours) >= 8 and all(STAMP.match(line) for line in ours), [x for x in ours if not STAMP.match(x)]


def test_status_from_the_folder_and_from_the_repo(tracked, hub, tmp_path):
    env = {**client_env(hub.url, tmp_path / "hf-home"), "HF_TOKEN": TOKEN, "PATH": os.environ["PATH"]}
    local = entrypoint(env, "status", str(tracked.out))
    assert local.returncode == 0, local.stderr
    assert f"ended: step {TOTAL_STEPS} of {TOTAL_STEPS}" in local.stdout and "ended: done, exit code 0" in local.stdout
    assert f"newest complete checkpoint on disk: checkpoint-{TOTAL_STEPS}" in local.stdout
    assert "newest complete checkpoint on the Hub: checkpoint-" in local.stdout and "final model: yes" in local.stdout
    remote = json.loads(entrypoint(env, "status", "alice/svc", "--json").stdout)
    complete = hub_checkpoints(head_files(hub, "alice/svc"))[0]
    assert remote["checkpoint_on_hub"] == f"checkpoint-{complete[-1]}" and remote["final_model"] is True
    assert (remote["ended_as"], remote["exit_code"]) == ("done", 0)


def test_the_model_is_at_the_repo_root_and_loads_with_the_real_client(tracked, hub, tmp_path):
    files = head_files(hub, "alice/svc")
    final = tracked.out / "final"
    assert {p.name for p in final.iterdir()} <= files.keys() and MANIFEST in files
    assert not any(p.startswith("final/") for p in files) and "run/events.jsonl" in files
    assert all(p.startswith(("checkpoints/checkpoint-", "run/")) or "/" not in p for p in files)
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
hub = AutoModelForCausalLM.from_pretrained("alice/svc").eval()
local = AutoModelForCausalLM.from_pretrained({str(final)!r}).eval()
AutoTokenizer.from_pretrained("alice/svc")
ids = torch.randint(0, local.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.testing.assert_close(hub(ids).logits, local(ids).logits, rtol=0, atol=0)
print("same logits")
"""
    env = {**os.environ, **client_env(hub.url, tmp_path / "hf-home"), "HF_TOKEN": TOKEN}
    loaded = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and "same logits" in loaded.stdout, loaded.stderr[-3000:]
    hf = Path(sys.executable).with_name("hf")
    got = subprocess.run([str(hf), "download", "alice/svc", "--local-dir", str(tmp_path / "dl")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    for path in final.iterdir():
        assert (tmp_path / "dl" / path.name).read_bytes() == path.read_bytes(), path.name


def test_the_model_card_says_what_was_trained_and_how(tracked, hub):
    card = hub.store.read_file("alice/svc", "README.md").decode()
    meta = card.split("---")[1]
    assert f"base_model: {MODEL_REPO}" in meta and "library_name: transformers" in meta
    summary = read_summary(tracked.out)
    assert 'from_pretrained("alice/svc")' in card and "hf download alice/svc" in card
    assert f"| final training loss | {summary['final_loss']} |" in card
    assert "![training loss](run/loss.png)" in card and "ZeRO 2" in card and "`SFT_REPORT_TO`" in card
    for library in ("torch", "deepspeed", "transformers", "trl", "huggingface_hub"):
        assert re.search(rf"^- {library} \d", card, re.M), library


# --------------------------------------------------------------------------------------------
# A time limit mid-run, and the next start
# --------------------------------------------------------------------------------------------


def _startup_seconds(run: Run) -> float:
    """From the process's start to training's (as the run's events tell it)."""
    began = next(when(t) for t, e in read_events(run.out / "run" / "events.jsonl") if isinstance(e, TrainStarted))
    return began - run.started


@pytest.fixture(scope="module")
def limited(hub, tracked, tmp_path_factory) -> dict:
    """SLURM's end time set so that the limit falls inside training: the start-up as the tracked run took it, half
    again for a busier machine, and 45 s of slowed steps (of the 87 s or more that 174 steps take)."""
    tmp = tmp_path_factory.mktemp("limited")
    env = env_for(hub, tmp, "alice/svc-time", hub_revision="run-1", time_limit="2h")
    end = int(time.time() + 1.5 * _startup_seconds(tracked) + 45)
    env.update(SFTTEST_STEP_SECONDS=str(SLOW_STEP_S), SLURM_JOB_END_TIME=str(end))
    log = tmp / "job.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT)
    started, during = time.time(), None
    try:
        while proc.poll() is None:  # `status` while it trains: the step and the time left
            progress = tmp / "out" / "run" / "progress.json"
            if during is None and progress.is_file() and json.loads(progress.read_text())["step"] >= 8:
                during = entrypoint({**env, "SFTTEST_STEP_SECONDS": ""}, "status", str(tmp / "out"))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    OUTPUTS.append(output)
    return dict(run=Run(proc.wait(), output, tmp / "out", started, time.time() - started), end=end, during=during,
                env=env)


def test_a_limit_mid_run_saves_and_uploads_a_checkpoint_then_exits_75(limited, hub):
    run, end = limited["run"], limited["end"]
    assert run.code == exitcodes.TIME_LIMIT, run.output[-4000:]
    summary = read_summary(run.out)
    stopped_at = summary["train"]["global_step"]
    assert summary["status"] == "stopped for time" and 8 < stopped_at < TOTAL_STEPS
    assert summary["time_limit"]["source"] == "SLURM_JOB_END_TIME"  # earlier than SFT_TIME_LIMIT=2h
    local = run.out / f"checkpoint-{stopped_at}"
    assert checkpoints.problem(local) is None
    files = head_files(hub, "alice/svc-time", "run-1")
    assert f"checkpoints/checkpoint-{stopped_at}/{MANIFEST}" in files
    manifest = json.loads(hub.store.read_file("alice/svc-time", f"checkpoints/checkpoint-{stopped_at}/{MANIFEST}",
                                              revision="run-1"))
    import hashlib

    for rel, entry in manifest["files"].items():
        assert hashlib.sha256((local / rel).read_bytes()).hexdigest() == entry["sha256"], rel
    assert set(head_files(hub, "alice/svc-time")) == {".gitattributes"}  # main untouched: the branch has it all
    found = read_events(run.out / "run" / "events.jsonl")
    (stop_at, stop), = [(t, e) for t, e in found if isinstance(e, StopRequested)]
    assert stop.reason == "time limit" and "save measured" in stop.detail
    ended_at, ended = found[-1]
    assert ended == Ended(status="stopped for time", exit_code=exitcodes.TIME_LIMIT)
    assert when(stop_at) < when(ended_at) <= end  # done before the scheduler's limit
    assert "time limit: stopping now to save and upload a checkpoint" in run.output


def test_status_while_it_trains_says_the_step_and_the_time_left(limited):
    during = limited["during"]
    assert during is not None and during.returncode == 0, limited["run"].output[-3000:]
    assert re.search(rf"training: step \d+ of {TOTAL_STEPS}, about .* left", during.stdout), during.stdout


@pytest.fixture(scope="module")
def resumed(hub, limited, tmp_path_factory) -> Run:
    """The next start, on a new machine: an empty disk, the same repo and branch, no limit."""
    tmp = tmp_path_factory.mktemp("resumed")
    return run_job(env_for(hub, tmp, "alice/svc-time", hub_revision="run-1"))


def test_the_next_start_resumes_from_the_hub_and_trains_as_if_never_stopped(resumed, limited, tracked, hub):
    assert resumed.code == 0, resumed.output[-4000:]
    summary = read_summary(resumed.out)
    stopped_at = read_summary(limited["run"].out)["train"]["global_step"]
    assert Path(summary["resumed_from"]).name == f"checkpoint-{stopped_at}"
    assert summary["train"]["global_step"] == TOTAL_STEPS
    reference, losses = step_losses(read_summary(tracked.out)), step_losses(summary)
    after = [k for k in reference if k > stopped_at]
    assert after and set(after) <= losses.keys()
    assert max(abs(losses[k] - reference[k]) for k in after) < 1e-4
    assert MANIFEST in head_files(hub, "alice/svc-time", "run-1")


# --------------------------------------------------------------------------------------------
# The budget gate
# --------------------------------------------------------------------------------------------

# A second of this machine costs 1 (3,600 per hour); 58 steps slowed to 0.2 s or more cost 11.6 or more
BUDGET = dict(epochs=1, probe_steps=6, price_per_hour=3600, max_cost=8)


@pytest.fixture(scope="module")
def refused(hub, tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("refused")
    env = env_for(hub, tmp, None, **BUDGET)
    env["SFTTEST_STEP_SECONDS"] = "0.2"
    return run_job(env)


def test_over_budget_is_refused_before_training_naming_what_would_fit(refused):
    assert refused.code == exitcodes.OVER_BUDGET, refused.output[-4000:]
    summary = read_summary(refused.out)
    assert summary["status"] == "over budget" and summary["train"] is None
    budget = summary["budget"]
    assert budget["verdict"] == "refuse" and "exceeds SFT_MAX_COST=8" in budget["reason"]
    cost = f"{summary['probe']['projected_cost']:.2f}"
    assert f"{STEPS_PER_EPOCH} steps" in budget["reason"] and cost in budget["reason"]
    steps = int(re.match(r"SFT_MAX_STEPS=(\d+)", budget["fits"][0]).group(1))
    assert 1 <= steps < STEPS_PER_EPOCH and any(f.startswith("SFT_BUDGET_ACTION=truncate") for f in budget["fits"])
    assert "error: budget: the projected run" in refused.output and "SFT_MAX_STEPS=" in refused.output
    assert not list(refused.out.glob("checkpoint-*")) and not (refused.out / "final").exists()
    # the probe was the training's launch: the verdict ended it after the probe's steps, saving nothing
    ended = [json.loads(p.read_text()) for p in sorted((refused.out / "run" / "reports").glob("train-rank*.json"))]
    assert ended and {(r["status"], r["global_step"]) for r in ended} == {("ended", BUDGET["probe_steps"])}


@pytest.fixture(scope="module")
def truncated(hub, tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("truncated")
    env = env_for(hub, tmp, None, budget_action="truncate", **BUDGET)
    env["SFTTEST_STEP_SECONDS"] = "0.2"
    return run_job(env)


def test_truncate_trains_the_steps_that_fit_and_finishes_normally(truncated):
    assert truncated.code == 0, truncated.output[-4000:]
    summary = read_summary(truncated.out)
    budget = summary["budget"]
    assert budget["verdict"] == "truncate" and 1 <= budget["max_steps"] < STEPS_PER_EPOCH
    assert summary["status"] == "done" and summary["train"]["global_step"] == budget["max_steps"]
    assert summary["decisions"]["max_steps"].startswith(f"{budget['max_steps']} steps, the steps that fit")
    probe = summary["probe"]
    assert budget["max_steps"] * probe["seconds_per_step"] <= BUDGET["max_cost"]  # a second costs 1
    assert (truncated.out / "final" / "config.json").is_file()
    # the probe's launch has the whole epoch's learning-rate schedule: the capped run is launched anew
    assert "train: launched again, for the steps the budget capped" in truncated.output
    assert "went_on_from_probe_step" not in summary["train"]


# --------------------------------------------------------------------------------------------
# The token
# --------------------------------------------------------------------------------------------


def test_the_token_is_in_no_file_log_or_upload(tracked, limited, resumed, refused, truncated, hub):
    """Not in any file a run wrote (training_args.bin, the TensorBoard and trackio logs included), nor in the
    Hub's storage, nor printed; the file it was read from (HF_TOKEN_PATH) aside."""
    needle, scanned = TOKEN.encode(), 0
    for folder in dict.fromkeys(SCANNED):
        for path in (p for p in folder.rglob("*") if p.is_file() and p.name != "token"):
            scanned += 1
            assert needle not in path.read_bytes(), f"the token is in {path}"
    names = {p.name for folder in SCANNED for p in folder.rglob("*")}
    assert scanned > 100 and "training_args.bin" in names and "huggingface.db" in names
    assert any(n.startswith("events.out.tfevents") for n in names)
    for text in [*OUTPUTS, hub.output()]:
        assert TOKEN not in text
