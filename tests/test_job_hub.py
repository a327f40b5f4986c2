"""The whole job with a Hub repo, end to end: entrypoint.py as a subprocess configured only by environment
variables, two CPU ranks on the demo model, against tests/hubserver/ in its own process (the real
huggingface_hub client speaking HTTP to 127.0.0.1), with faults injected on its requests.

The Hub's state is read from the server's storage on disk (RepoStore, tests/hubserver/store.py), never
through the job's own code: commits, their order and dates, the files of every commit.

Each job run takes about 45 s on two cores (most of it start-up: 128 steps train in 6-26 s), so the
runs are module fixtures shared by the tests that check them:
    cadence   a full run, uploads every 1.2 s; also the loss reference of the resume test
    outage    a full run with commits and LFS uploads answered 500 for a while
    killed    kill -9 of the whole process tree while a checkpoint's upload is held open, then a
              fresh start on an empty output folder that resumes from the Hub
    sigterm   SIGTERM to the controller mid-run
plus a few starts that end in seconds (refused tokens, a public repo, a finished job).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from conftest import REPO, demo_env, process_tree, read_summary, send_signal, step_losses
from hub_fixtures import HubProcess, client_env, not_yet, start_hub_process
from hubserver import RepoStore

from sft import checkpoints, exitcodes
from sft.hub.manifest import MANIFEST

pytestmark = pytest.mark.slow

# A token no library, log or file would hold by chance: the last test searches for it everywhere.
TOKEN = "hf_FAKE-e2e-secret-Zq7VxK2pLm9RwT4yNc8BdF3hJ"  # not a token's shape: no scanner mistakes it
READ_ONLY_TOKEN = "hf_FAKE-e2e-read-only-Pq4Ws8ZtX1vGm6KcR2nLb7Hy"
UPLOAD_MINUTES = 0.02  # 1.2 s between upload rounds (the job's 30 minutes, shortened)
INTERVAL_S = UPLOAD_MINUTES * 60
KEEP = 2
# Two epochs of 64 steps (512 conversations / (2 ranks x micro-batch 1 x accumulation 4)): one epoch trains
# in as little as 3 s here, two or three upload rounds, too few for the cadence tests to count on.
EPOCHS = 2
CADENCE_STEP_S = 0.1  # at least 12.8 s of steps in the whole run: ten upload rounds or more
TOTAL_STEPS = EPOCHS * 64  # the job's last step
JOB = dict(zero_stage="2", precision="fp32", seed=0, learning_rate=2e-3, logging_steps=1, probe_steps=0,
           save_steps=8, save_total_limit=KEEP, upload_minutes=UPLOAD_MINUTES, packing="false", epochs=EPOCHS)
# A start refused before training is told by what did not happen (no launcher's "$ " line, nothing written),
# not by a time: on a loaded machine the imports alone can take 30 s.

# Everything the job runs wrote or printed, searched for the token by the last test.
SCANNED_DIRS: list[Path] = []
OUTPUTS: list[str] = []


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    code: int
    output: str  # stdout and stderr
    out: Path  # SFT_OUTPUT_DIR
    seconds: float


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> HubProcess:
    root = tmp_path_factory.mktemp("hub")
    SCANNED_DIRS.append(root)
    process = start_hub_process(root)
    process.add_token(TOKEN, "alice", "write")
    process.add_token(READ_ONLY_TOKEN, "alice", "read")
    process.root = root
    process.store = RepoStore(root)  # read-only use from this process: commits are files renamed into place
    yield process
    process.stop()


def job_env(hub: HubProcess, tmp: Path, repo: str | None, token: str | None = TOKEN, **settings) -> dict[str, str]:
    SCANNED_DIRS.append(tmp)
    env = demo_env(tmp, **{**JOB, **settings})
    env.update(client_env(hub.url, tmp / "hf-home"))  # HF_ENDPOINT, HF_HUB_OFFLINE=0, ...
    # Not set by us: the job chooses Git LFS itself (sft/hub/transport.py), as it does for users. With hf_xet
    # installed, a job that did not would upload through Xet, which this server refuses (501).
    del env["HF_HUB_DISABLE_XET"]
    if repo is not None:
        env["SFT_HUB_REPO"] = repo
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def run_job(env: dict[str, str], timeout: float = 400) -> Run:
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=timeout, check=False)
    OUTPUTS.extend([result.stdout, result.stderr])
    return Run(result.returncode, result.stdout + result.stderr, Path(env["SFT_OUTPUT_DIR"]),
               time.monotonic() - started)


def start_job(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:  # a file, not a pipe: nobody has to drain it while the test waits
        return subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the job and every process under it at once, as a VM that dies.

    The launcher runs the ranks in a session of their own (so a signal for the job reaches the controller
    first): killing the controller's process group alone would leave torchrun and the ranks running.
    """
    family = process_tree(proc.pid)
    send_signal(family, signal.SIGKILL)
    proc.wait(30)
    psutil.wait_procs(family, timeout=30)


def wait_until(predicate, proc: subprocess.Popen | None, log: Path | None, what: str, timeout: float = 300,
               every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = not_yet(predicate)
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job ended (exit {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            predicate()  # unguarded: a repo or branch still missing fails as itself, not as a timeout
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def commits(hub: HubProcess, repo: str) -> list[dict]:
    """The repo's commits, oldest first, each with its whole file map and date."""
    sha = hub.store.resolve("models", repo, "main")
    return list(reversed(list(hub.store.history("models", repo, sha))))


def head_files(hub: HubProcess, repo: str) -> dict[str, dict]:
    return hub.store.files("models", repo, "main")[1]


def read_hub(hub: HubProcess, repo: str, path: str) -> bytes:
    return hub.store.read_file(repo, path)


CKPT = "checkpoints/checkpoint-"  # where the repo holds checkpoint-N (the final model is at its root)


def complete_steps(files) -> list[int]:
    """Steps whose checkpoints/checkpoint-N/manifest.json is in the file map."""
    return sorted(int(p.split("/")[1].split("-")[1]) for p in files
                  if p.startswith(CKPT) and p.endswith(f"/{MANIFEST}") and p.count("/") == 2)


def present_steps(files) -> list[int]:
    return sorted({int(p.split("/")[1].split("-")[1]) for p in files if p.startswith(CKPT)})


def final_files(files) -> dict[str, dict]:
    """The final model's files at the repo's root (its manifest included), not the card's nor .gitattributes."""
    return {p: e for p, e in files.items() if "/" not in p and p not in ("README.md", ".gitattributes")}


def when(commit: dict) -> float:
    return datetime.fromisoformat(commit["date"]).timestamp()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def repo_exists(hub: HubProcess, repo: str) -> bool:
    return hub.store.exists("models", repo)


def log_for(hub: HubProcess, repo: str) -> list[dict]:
    return [e for e in hub.request_log() if repo in e["path"]]


def writes(entries: list[dict]) -> list[dict]:
    """Requests that would change a repo: create, settings, preupload, commit, LFS."""
    return [e for e in entries if e["method"] in ("POST", "PUT", "DELETE") and "paths-info" not in e["path"]]


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def shard_names(files, step: int) -> set[str]:
    return {p.rsplit("/", 1)[-1] for p in files if p.startswith(f"{CKPT}{step}/global_step{step}/")}


def is_whole(files, step: int) -> bool:
    """checkpoint-N in a file map holds what sft/checkpoints.py requires: trainer_state.json, latest, 2 shards."""
    names = shard_names(files, step)
    ranks = sorted(int(m.group(1)) for n in names if (m := checkpoints.SHARD.match(n)))
    return (f"{CKPT}{step}/trainer_state.json" in files and f"{CKPT}{step}/latest" in files
            and ranks == [0, 1])


def assert_matches_manifest(hub: HubProcess, repo: str, files: dict[str, dict], step_or_final) -> dict:
    """The manifest of checkpoint-N (or of the final model, at the root) in `files` lists exactly its other files,
    sizes and sha256s."""
    if step_or_final == "final":
        manifest = json.loads(hub.store.blob_path(files[MANIFEST]["sha256"]).read_bytes())
        listed, actual = manifest["files"], {p: e for p, e in final_files(files).items() if p != MANIFEST}
    else:
        prefix = f"{CKPT}{step_or_final}"
        manifest = json.loads(hub.store.blob_path(files[f"{prefix}/{MANIFEST}"]["sha256"]).read_bytes())
        listed = {f"{prefix}/{rel}": entry for rel, entry in manifest["files"].items()}
        actual = {p: e for p, e in files.items() if p.startswith(prefix + "/") and p != f"{prefix}/{MANIFEST}"}
    assert listed.keys() == actual.keys(), (prefix, listed.keys() ^ actual.keys())
    for path, entry in listed.items():
        assert (entry["size"], entry["sha256"]) == (actual[path]["size"], actual[path]["sha256"]), path
    return manifest


# --------------------------------------------------------------------------------------------
# Starts refused before training
# --------------------------------------------------------------------------------------------


def test_public_repo_is_refused_and_nothing_is_uploaded_or_trained(hub, tmp_path):
    _create_repo(hub, "public-run", private=False)
    before = commits(hub, "alice/public-run")
    run = run_job(job_env(hub, tmp_path, "alice/public-run"))
    assert run.code == exitcodes.HUB_PUBLIC_REPO, run.output[-3000:]
    assert "public" in run.output
    assert commits(hub, "alice/public-run") == before  # not a file, not even made private behind the user's back
    assert hub.store.meta("models", "alice/public-run")["private"] is False
    assert not writes(log_for(hub, "alice/public-run"))
    assert files_under(run.out) == []  # nothing trained, nothing written
    assert "$ " not in run.output  # no launcher started


@pytest.mark.parametrize("token", ["missing", "unknown", "read-only"])
def test_refused_token_fails_before_training(hub, tmp_path, token):
    repo = f"alice/token-{token}"
    value = {"missing": None, "unknown": "hf_e2eUnknownTokenWq3Zr5Xt9Ks2Lm", "read-only": READ_ONLY_TOKEN}[token]
    run = run_job(job_env(hub, tmp_path, repo, token=value))
    # a missing token is found with the settings (exit 2), before the Hub is asked; the Hub refuses the others
    assert run.code == (exitcodes.BAD_SETTINGS if value is None else exitcodes.HUB_AUTH), run.output[-3000:]
    assert "HF_TOKEN" in run.output
    assert not repo_exists(hub, repo)  # not created with a token that was refused
    assert files_under(run.out) == []
    assert "$ " not in run.output
    if value:
        assert value not in run.output


def _create_repo(hub: HubProcess, name: str, private: bool) -> None:
    """The repo made by someone else beforehand, through the server's API (urllib: no client config involved)."""
    import urllib.request

    body = json.dumps({"name": name, "organization": "alice", "private": private, "type": "model"}).encode()
    request = urllib.request.Request(hub.url + "/api/repos/create", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


# --------------------------------------------------------------------------------------------
# A whole run: cadence, manifest last, retention, the end
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cadence(hub, tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("cadence")
    # Slower steps (sft/dev/faults.py), so the upload rounds the tests below count happen whatever the machine:
    # on a fast one the 128 steps trained in 6 s, three rounds of 1.2 s with the uploads between (CI, stop 53).
    env = {**job_env(hub, tmp, "alice/cadence"), "SFTTEST_STEP_SECONDS": str(CADENCE_STEP_S)}
    run = run_job(env)
    assert run.code == 0, run.output[-4000:]
    return run


def test_checkpoints_reach_the_hub_during_training_at_the_interval(hub, cadence):
    history = commits(hub, "alice/cadence")
    manifests = [c for c in history if c["title"].startswith("checkpoint-") and c["title"].endswith("complete)")]
    trained_at = (cadence.out / "final" / "config.json").stat().st_mtime  # save_model after the last step
    during = [c for c in manifests if when(c) < trained_at]
    assert len(during) >= 2, [(c["title"], c["date"]) for c in manifests]
    gaps = [when(b) - when(a) for a, b in itertools.pairwise(manifests)]
    assert min(gaps) >= 0.8 * INTERVAL_S, gaps  # one round per interval, not one per checkpoint
    steps = [int(c["title"].split(":")[0].split("-")[1]) for c in manifests]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # newer each time, never one twice
    assert all(s % JOB["save_steps"] == 0 for s in steps)
    assert "upload: every 1.2 s" in cadence.output and "is on the Hub" in cadence.output


def test_uploads_go_through_git_lfs_as_the_job_chose_with_no_variable_set(hub, cadence):
    assert "hub: uploading to" in cadence.output and "through Git LFS" in cadence.output
    log = [e for e in hub.request_log() if "/alice/cadence" in e["path"]]
    assert any(e["path"].endswith(".git/info/lfs/objects/batch") for e in log)
    assert not any("xet" in e["path"] for e in log)


def test_only_complete_checkpoints_and_each_manifest_after_its_files(hub, cadence):
    history = commits(hub, "alice/cadence")
    parents = {c["id"]: c for c in history}
    seen_manifests = 0
    for commit in history:
        files = commit["files"]
        for step in present_steps(files):  # at no commit is a checkpoint on the Hub half-written
            assert is_whole(files, step), (commit["title"], step)
        parent = parents[commit["parents"][0]]["files"] if commit["parents"] else {}
        added = {p for p in files if p not in parent or files[p] != parent[p]}
        new_manifests = {p for p in added if p.endswith(f"/{MANIFEST}") and p.startswith(CKPT)}
        if new_manifests:
            # a commit of its own, on top of a commit that already held every file it lists
            assert len(added) == 1 and len(new_manifests) == 1 and not (parent.keys() - files.keys()), commit["title"]
            step = complete_steps(new_manifests)[0]
            assert is_whole(parent, step)
            assert_matches_manifest(hub, "alice/cadence", files, step)
            seen_manifests += 1
        elif any(p.startswith(CKPT) for p in added):
            # a commit of checkpoint files: one checkpoint, whole, no manifest yet
            steps = present_steps(added)
            assert len(steps) == 1 and f"{CKPT}{steps[0]}/{MANIFEST}" not in files, commit["title"]
    assert seen_manifests >= 3


def test_hub_keeps_save_total_limit_checkpoints_deleting_only_after_a_newer_manifest(hub, cadence):
    history = commits(hub, "alice/cadence")
    uploaded: set[int] = set()
    for commit in history:  # the Hub never holds fewer complete checkpoints than it could
        complete = complete_steps(commit["files"])
        uploaded |= set(complete)
        assert len(complete) >= min(KEEP, len(uploaded)), (commit["title"], complete, sorted(uploaded))
        torn = set(present_steps(commit["files"])) - set(complete)  # only between a checkpoint's two commits:
        assert not torn or (len(torn) == 1 and commit["title"].startswith(f"checkpoint-{min(torn)}: ")
                            and "manifest" not in commit["title"]), (commit["title"], torn)
    files = head_files(hub, "alice/cadence")
    assert complete_steps(files) == present_steps(files) == sorted(uploaded)[-KEEP:]
    assert len(uploaded) > KEEP and any(c["title"].startswith("retention: delete") for c in history)
    # what is on the Hub is what is on disk, byte for byte
    for step in complete_steps(files):
        local = cadence.out / f"checkpoint-{step}"
        if local.is_dir():
            manifest = assert_matches_manifest(hub, "alice/cadence", files, step)
            for rel, entry in manifest["files"].items():
                assert sha256(local / rel) == entry["sha256"], rel


def test_final_model_reports_and_card_on_the_hub_and_in_the_summary(hub, cadence):
    files = head_files(hub, "alice/cadence")
    manifest = assert_matches_manifest(hub, "alice/cadence", files, "final")
    assert "config.json" in manifest["files"] and "model.safetensors" in manifest["files"]
    for rel, entry in manifest["files"].items():
        assert sha256(cadence.out / "final" / rel) == entry["sha256"], rel
    for path in ("run/summary.json", "run/loss.png", "run/settings.json", "README.md"):
        assert path in files, path
    assert read_hub(hub, "alice/cadence", "run/loss.png").startswith(b"\x89PNG")
    on_hub = json.loads(read_hub(hub, "alice/cadence", "run/summary.json"))
    assert on_hub["status"] == "done" and on_hub["train"]["global_step"] == TOTAL_STEPS
    card = read_hub(hub, "alice/cadence", "README.md").decode()
    assert card.startswith("---") and "library_name: transformers" in card
    assert 'from_pretrained("alice/cadence")' in card and "subfolder" not in card
    history = commits(hub, "alice/cadence")
    files_at = next(i for i, c in enumerate(history) if "config.json" in c["files"])
    manifest_at = next(i for i, c in enumerate(history) if MANIFEST in c["files"])
    assert files_at < manifest_at  # the final model too: the manifest last
    summary = read_summary(cadence.out)
    hub_summary = summary["hub"]
    assert summary["status"] == "done" and summary["exit_code"] == 0
    assert hub_summary["repo"] == "alice/cadence" and hub_summary["final"] is True
    assert hub_summary["checkpoints"] == [f"checkpoint-{s}" for s in complete_steps(files)]
    uploads = hub_summary["uploads"]
    assert [u["folder"] for u in uploads][-1] == "final" and len(uploads) >= 4
    assert hub_summary["bytes"] == sum(u["bytes"] for u in uploads) and hub_summary["mb_per_s"] > 0
    assert hub_summary["last_error"] is None
    assert summary["resumed_from"] is None


# --------------------------------------------------------------------------------------------
# A finished job started again
# --------------------------------------------------------------------------------------------


def test_second_start_of_a_finished_job_exits_0_without_training(hub, cadence, tmp_path):
    before_files = {p: p.stat().st_mtime_ns for p in files_under(cadence.out)}
    before_commits = len(commits(hub, "alice/cadence"))
    env = job_env(hub, tmp_path, "alice/cadence")
    env["SFT_OUTPUT_DIR"] = str(cadence.out)
    run = run_job(env)
    assert run.code == 0, run.output[-3000:]
    assert "already trained" in run.output and "$ " not in run.output
    assert {p: p.stat().st_mtime_ns for p in files_under(cadence.out)} == before_files
    assert len(commits(hub, "alice/cadence")) == before_commits


def test_empty_disk_with_the_final_model_on_the_hub_exits_0_at_once(hub, cadence, tmp_path):
    before_commits = len(commits(hub, "alice/cadence"))
    run = run_job(job_env(hub, tmp_path, "alice/cadence"))
    assert run.code == 0, run.output[-3000:]
    assert "already on" in run.output and "$ " not in run.output
    assert files_under(run.out) == []  # nothing downloaded, nothing trained
    assert len(commits(hub, "alice/cadence")) == before_commits


# --------------------------------------------------------------------------------------------
# An outage during training
# --------------------------------------------------------------------------------------------


def start_until_first_checkpoint(hub: HubProcess, tmp: Path, repo: str) -> tuple[subprocess.Popen, Path]:
    """Start the job on `repo`; return once checkpoint-8 is whole on disk (the job and its log)."""
    log = tmp / "job.log"
    proc = start_job(job_env(hub, tmp, repo), log)
    try:
        # whole: trainer_state.json comes while its files may still be written in the background, by threads of
        # the ranks that a SIGSTOP would stop half-way (no checkpoint complete then, nothing to upload)
        wait_until(lambda: checkpoints.problem(tmp / "out" / "checkpoint-8") is None, proc, log,
                   "the first checkpoint on disk", every=0.02)
    except BaseException:
        kill_tree(proc)
        raise
    return proc, log


def signal_ranks(proc: subprocess.Popen, sig: int) -> int:
    """Send `sig` to everything under the controller (launcher and ranks), not to the controller itself."""
    family = process_tree(proc.pid)[1:]
    send_signal(family, sig)
    return len(family)


@pytest.fixture(scope="module")
def outage(hub, tmp_path_factory, cadence):
    """A full run with the Hub down for a while: from its first checkpoint on disk, every commit answers 500
    until the uploader has met that twice (and the first two LFS uploads too: huggingface_hub retries those
    itself). Training pauses (SIGSTOP to the ranks: a slow step) from that checkpoint until the uploader
    caught up after the outage, so each phase waits for the uploader, never for the clock: 128 steps take
    only 6-26 s here, and an outage timed against them could outlast the training."""
    repo = "alice/outage"
    tmp = tmp_path_factory.mktemp("outage")
    proc, log = start_until_first_checkpoint(hub, tmp, repo)
    paused = False
    try:
        paused = signal_ranks(proc, signal.SIGSTOP) > 0
        before = complete_steps(head_files(hub, repo))
        commit = hub.add_fault("status", status=500, method="POST", path=f"/{repo}/commit/", count=None)
        put = hub.add_fault("status", status=500, method="PUT", path="/_lfs/upload/", count=2)
        wait_until(lambda: sum(f["hits"] for f in hub.faults() if f["id"] == commit) >= 2, proc, log,
                   "two failed commits", every=0.1)
        hits = {f["id"]: f["hits"] for f in hub.faults()}
        hub.control("DELETE", "/_test/faults")
        ended = time.time()
        wait_until(lambda: [s for s in complete_steps(head_files(hub, repo)) if s not in before], proc, log,
                   "a checkpoint on the Hub after the outage", timeout=120, every=0.1)
        signal_ranks(proc, signal.SIGCONT)
        paused = False
        proc.wait(400)
    finally:
        if paused:
            signal_ranks(proc, signal.SIGCONT)
        if proc.poll() is None:
            kill_tree(proc)
    output = log.read_text()
    OUTPUTS.append(output)
    return dict(run=Run(proc.returncode, output, tmp / "out", 0), repo=repo, before=before, ended=ended,
                commit_hits=hits[commit], put_hits=hits[put])


def test_outage_during_training_training_finishes_and_uploads_catch_up(hub, outage, cadence):
    run, repo = outage["run"], outage["repo"]
    assert run.code == 0, run.output[-4000:]
    assert outage["commit_hits"] >= 2 and outage["put_hits"] == 2
    assert "warning: upload failed" in run.output and "behind" in run.output
    summary = read_summary(run.out)
    assert summary["status"] == "done" and summary["train"]["global_step"] == TOTAL_STEPS
    # the outage changed nothing in training
    reference, losses = step_losses(read_summary(cadence.out)), step_losses(summary)
    assert losses.keys() == reference.keys()
    assert max(abs(losses[k] - reference[k]) for k in reference) < 1e-4
    history = commits(hub, repo)
    after = [c for c in history if when(c) > outage["ended"] and c["title"].endswith("complete)")]
    newest_before = max(outage["before"], default=0)
    caught_up = [int(c["title"].split(":")[0].split("-")[1]) for c in after if c["title"].startswith("checkpoint-")]
    assert caught_up and max(caught_up) > newest_before, (caught_up, outage["before"])
    files = head_files(hub, repo)
    # Newest wins: after the outage the uploader skips checkpoints that a newer one overtook, and at the end
    # final/ supersedes the last checkpoint (it goes up only if a round came first), so how many reach the
    # Hub depends on timing; what must hold is no torn checkpoint, none older than the catch-up, and no more
    # than the limit.
    assert complete_steps(files) == present_steps(files) and 1 <= len(complete_steps(files)) <= KEEP
    assert max(complete_steps(files)) >= max(caught_up)
    for step in complete_steps(files):
        assert_matches_manifest(hub, repo, files, step)
    manifest = assert_matches_manifest(hub, repo, files, "final")
    for rel, entry in manifest["files"].items():
        assert sha256(run.out / "final" / rel) == entry["sha256"], rel
    assert {"run/summary.json", "run/loss.png", "README.md"} <= files.keys()
    assert summary["hub"]["final"] is True and summary["hub"]["last_error"] is None


# --------------------------------------------------------------------------------------------
# kill -9 while a checkpoint uploads, then a fresh disk
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed(hub, tmp_path_factory, cadence):
    """Hold a checkpoint's upload open (its files committed, its manifest's request stalled), kill -9 the
    whole job, then start it again on an empty output folder."""
    repo = "alice/killed"
    tmp = tmp_path_factory.mktemp("killed")
    log = tmp / "job.log"
    # steps slowed as the cadence run's: on a fast machine the 128 steps could end before the kill lands mid-run
    proc = start_job({**job_env(hub, tmp, repo), "SFTTEST_STEP_SECONDS": str(CADENCE_STEP_S)}, log)
    try:
        wait_until(lambda: complete_steps(head_files(hub, repo)), proc, log, "the first checkpoint on the Hub")
        # The uploader is idle now for an interval. Its next checkpoint: the preupload of its files passes,
        # the preupload of its manifest (the request before the manifest's commit) hangs.
        preupload = f"/api/models/{repo}/preupload/"
        hub.add_fault("stall", seconds=0, method="POST", path=preupload, count=1)
        stall = hub.add_fault("stall", seconds=600, method="POST", path=preupload, count=1)
        wait_until(lambda: any(f["id"] == stall and f["hits"] for f in hub.faults()), proc, log,
                   "the manifest's upload to hang", every=0.1)
        time.sleep(0.5)
        kill_tree(proc)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    hub.control("DELETE", "/_test/faults")
    first = log.read_text()
    OUTPUTS.append(first)
    files = head_files(hub, repo)
    at_kill = dict(complete=complete_steps(files), present=present_steps(files),
                   local=[checkpoints.step_of(p) for p in checkpoints.all_checkpoints(tmp / "out")])
    fresh = tmp_path_factory.mktemp("killed-fresh")
    run = run_job(job_env(hub, fresh, repo))
    return dict(first=first, at_kill=at_kill, run=run, repo=repo)


def test_kill_9_mid_upload_then_an_empty_disk_resumes_from_the_hub(hub, killed, cadence):
    at_kill, run, repo = killed["at_kill"], killed["run"], killed["repo"]
    assert at_kill["complete"], at_kill
    torn = [s for s in at_kill["present"] if s not in at_kill["complete"]]
    assert torn and max(torn) > max(at_kill["complete"]), at_kill  # its files were up, its manifest was not
    assert max(at_kill["local"]) < TOTAL_STEPS  # killed mid-run
    assert run.code == 0, run.output[-4000:]
    summary = read_summary(run.out)
    resumed = Path(summary["resumed_from"])
    assert resumed.name == f"checkpoint-{max(at_kill['complete'])}" and resumed.parent == run.out
    assert f"checkpoint-{max(torn)} on the Hub has no manifest" in run.output
    # what the download cost, said (issue 42: a resume's start)
    assert re.search(r"downloaded from alice/killed and verified \([\d.]+ MB in [\d.]+ s, [\d.]+ MB/s\)", run.output)
    assert summary["train"]["global_step"] == TOTAL_STEPS
    step = checkpoints.step_of(resumed)
    reference, losses = step_losses(read_summary(cadence.out)), step_losses(summary)
    after = [k for k in reference if k > step]
    assert after and set(after) <= losses.keys()
    worst = max(abs(losses[k] - reference[k]) for k in after)
    assert worst < 1e-4, worst
    files = head_files(hub, repo)  # the torn checkpoint did not outlive the fresh start
    assert complete_steps(files) == present_steps(files)
    for s in complete_steps(files):
        assert_matches_manifest(hub, repo, files, s)
    assert MANIFEST in files


# --------------------------------------------------------------------------------------------
# SIGTERM
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sigterm(hub, tmp_path_factory):
    repo = "alice/sigterm"
    tmp = tmp_path_factory.mktemp("sigterm")
    proc, log = start_until_first_checkpoint(hub, tmp, repo)
    try:
        os.kill(proc.pid, signal.SIGTERM)  # docker stop: the container's init forwards it to the controller
        proc.wait(300)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    output = log.read_text()
    OUTPUTS.append(output)
    return dict(run=Run(proc.returncode, output, tmp / "out", 0), repo=repo)


def test_sigterm_saves_and_uploads_a_checkpoint_then_exits_143(hub, sigterm):
    run, repo = sigterm["run"], sigterm["repo"]
    assert run.code == exitcodes.STOPPED, run.output[-4000:]
    summary = read_summary(run.out)
    stopped_at = summary["train"]["global_step"]
    # a stop that comes while checkpoint-8 is being closed stops at 8 (every rank checks after a save too)
    assert summary["status"] == "stopped" and 8 <= stopped_at < TOTAL_STEPS
    local = run.out / f"checkpoint-{stopped_at}"
    assert checkpoints.problem(local) is None
    files = head_files(hub, repo)
    assert f"{CKPT}{stopped_at}/{MANIFEST}" in files
    manifest = assert_matches_manifest(hub, repo, files, stopped_at)
    for rel, entry in manifest["files"].items():
        assert sha256(local / rel) == entry["sha256"], rel
    assert f"flush: checkpoint-{stopped_at} is on the Hub" in run.output
    assert MANIFEST not in files and not final_files(files) and not (run.out / "final").exists()


# --------------------------------------------------------------------------------------------
# The token
# --------------------------------------------------------------------------------------------


def test_the_token_is_nowhere(hub, cadence, outage, killed, sigterm):
    """Not in any file any run wrote (training_args.bin included), nor stored by the server, nor printed."""
    needles = [TOKEN.encode(), READ_ONLY_TOKEN.encode()]
    scanned = 0
    for folder in dict.fromkeys(SCANNED_DIRS):
        for path in files_under(folder):
            data = path.read_bytes()
            scanned += 1
            for needle in needles:
                assert needle not in data, f"the token is in {path}"
    assert scanned > 100
    assert any(p.name == "training_args.bin" for d in SCANNED_DIRS for p in files_under(d))
    assert len(list((hub.root / "objects").rglob("*"))) > 20  # the uploads were searched too
    for text in [*OUTPUTS, hub.output()]:
        for needle in needles:
            assert needle.decode() not in text
