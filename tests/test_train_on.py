"""The probe as the training's own launch (planner/rules.py::probe_goes_on): after its steps the ranks wait for
the controller's verdict and go on as the training. The whole job as a subprocess, two ranks on gloo through the
real launcher, real DeepSpeed ZeRO; against the same job with no probe, which it must not change by a step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, demo_env, read_summary, run_entrypoint, step_losses
from hub_fixtures import client_env, start_hub_process
from hubserver import RepoStore

from sft import exitcodes
from sft.hub.layout import hub_checkpoints

pytestmark = pytest.mark.slow

RUN = dict(save_steps=6, save_total_limit=2, max_steps=8, logging_steps=1, learning_rate=2e-3, precision="fp32",
           seed=0, packing="false", zero_stage="2")
PROBE_STEPS = 3
TOKEN = "hf_FAKE-probe-stop-secret-Kd8RmW3qTz6Yv"  # not a token's shape: no scanner mistakes it


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The job with its probe in the training's launch, and the same job with no probe."""
    done = {}
    for name, probe_steps in (("went_on", PROBE_STEPS), ("unprobed", 0)):
        tmp = tmp_path_factory.mktemp(name)
        result = run_entrypoint(demo_env(tmp, probe_steps=probe_steps, **RUN))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        done[name] = (result, tmp / "out")
    return done


def test_the_probe_goes_on_as_the_training_in_one_launch(runs):
    result, out = runs["went_on"]
    launches = [line for line in result.stdout.splitlines() if "$ " in line and "sft.ranks.train" in line]
    assert len(launches) == 1, launches
    summary = read_summary(out)
    assert summary["decisions"]["probe"].startswith(f"the training's own launch: its first {PROBE_STEPS} steps")
    assert summary["probe"]["steps"] == PROBE_STEPS and summary["probe"]["tokens_per_second"] > 0
    assert summary["train"]["went_on_from_probe_step"] == PROBE_STEPS
    assert summary["status"] == "done" and summary["train"]["global_step"] == RUN["max_steps"]
    assert f"train: ZeRO 2, going on from the probe's step {PROBE_STEPS}, in its launch" in result.stdout
    assert json.loads((out / "run" / "verdict.json").read_text())["go_on"] is True
    assert not (out / "run" / "spec-probe.json").exists() and not (out / "run" / "probe").exists()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8"]
    assert (out / "final" / "config.json").is_file()
    events = [json.loads(line)["event"] for line in (out / "run" / "events.jsonl").read_text().splitlines()]
    assert events.count("train_started") == 1


def test_its_steps_are_the_runs_first_with_the_losses_of_a_run_without_probe(runs):
    """The wait changes nothing in what is trained: the data's order, the schedule and the weights."""
    went_on, unprobed = (step_losses(read_summary(runs[name][1])) for name in ("went_on", "unprobed"))
    assert sorted(went_on) == list(range(1, RUN["max_steps"] + 1)) and went_on.keys() == unprobed.keys()
    assert max(abs(went_on[k] - unprobed[k]) for k in went_on) < 1e-5, (went_on, unprobed)


@pytest.fixture
def hub(tmp_path):
    process = start_hub_process(tmp_path / "hub")  # a local Hub server, its own process (tests/hubserver)
    process.add_token(TOKEN, "alice", "write")
    yield process
    process.stop()


def test_a_stop_during_the_probes_steps_keeps_them_uploads_them_and_the_next_start_resumes(tmp_path, hub):
    """docker stop while the probe times its steps: they are the training's, so the ranks save them as a training
    launch does, the checkpoint goes to the Hub before the job exits (its uploader had not begun: it begins at
    the verdict), and the next start resumes there (it does not probe again)."""
    env = demo_env(tmp_path, probe_steps=5, **RUN)
    env.update(client_env(hub.url, tmp_path / "hf-home"), SFT_HUB_REPO="alice/stopped-in-probe", HF_TOKEN=TOKEN)
    del env["HF_HUB_DISABLE_XET"]  # the job chooses Git LFS itself, as for users (test_job_hub.py)
    env["SFTTEST_STEP_SECONDS"] = "0.5"  # steps long enough to stop among them
    out, log = tmp_path / "out", tmp_path / "job.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (out / "run" / "progress.json").exists():  # rank 0 writes it from the training's first step
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=300)
    assert proc.returncode == exitcodes.STOPPED, log.read_text()[-3000:]
    summary = read_summary(out)
    assert summary["decisions"]["probe"].startswith("the training's own launch")
    assert summary["status"] == "stopped" and summary["probe"] is None
    saved = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")]
    assert len(saved) == 1 and 1 <= saved[0] < 5, saved
    on_hub = hub_checkpoints(RepoStore(tmp_path / "hub").files("models", "alice/stopped-in-probe", "main")[1])
    assert on_hub[0] == saved, (on_hub, log.read_text()[-3000:])
    del env["SFTTEST_STEP_SECONDS"]
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = read_summary(out)
    assert summary["resumed_from"].endswith(f"checkpoint-{saved[0]}") and summary["probe"] is None
    assert summary["train"]["global_step"] == RUN["max_steps"]
