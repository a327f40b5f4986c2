"""sft/hub/ (preflight, uploader) against the local Hub server (tests/hubserver/), through the real
huggingface_hub client.

Checkpoints are folders on disk in the Trainer + DeepSpeed layout (tests/checkpoint_layout.py); the
interval is a fraction of a second, so every test takes a few seconds and trains nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd

from checkpoint_layout import REAL_LAYOUT, complete_checkpoint, layout, make_checkpoint, tree
from hub_fixtures import READ_TOKEN, WRITE_TOKEN, hub_api, hub_server, not_yet  # noqa: F401  (fixtures)
from sft import checkpoints, exitcodes
from sft.hub import preflight as hub_preflight
from sft.hub.errors import HubError
from sft.hub.manifest import MANIFEST
from sft.hub.preflight import preflight
from sft.hub.uploader import Uploader

REPO = "alice/sft-run"
INTERVAL = 0.8  # seconds between rounds: the job's 30 minutes, shortened


def wait_for(predicate, timeout: float = 20.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not_yet(predicate):
            return True
        time.sleep(every)
    return predicate()  # unguarded: a repo still missing at the deadline fails as itself


def commits(server, repo: str = REPO) -> list[dict]:
    """The repo's commits on the server, oldest first, each with its full file map."""
    sha = server.store.resolve("models", repo, "main")
    return list(reversed(list(server.store.history("models", repo, sha))))


def hub_files(server, repo: str = REPO) -> dict[str, dict]:
    return server.store.files("models", repo, "main")[1]


def manifest_on_hub(server, step: int, repo: str = REPO) -> dict:
    return json.loads(server.store.read_file(repo, f"checkpoints/checkpoint-{step}/{MANIFEST}"))


@pytest.fixture
def target(hub_server):
    return preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url)


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "out"


@pytest.fixture
def make_uploader(target, out):
    """Uploader(s) on `out`, with their log lines; all stopped at the end of the test."""
    made = []

    def make(interval: float = INTERVAL, keep: int = 2, retry_s: float = 0.2):
        lines: list[str] = []
        u = Uploader(target, out, interval_s=interval, keep=keep, retry_s=retry_s, log=lines.append)
        u.lines = lines
        made.append(u)
        return u

    yield make
    for u in made:
        u.stop(10)


# -- preflight -----------------------------------------------------------------------------------


def test_preflight_creates_the_repo_private(hub_server):
    t = preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url)
    assert t.created and t.user == "alice" and t.repo_id == REPO
    assert hub_server.store.meta("models", REPO)["private"] is True
    assert WRITE_TOKEN not in repr(t) and WRITE_TOKEN not in json.dumps(t.to_dict())
    assert preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url).created is False  # a second start


def test_public_repo_refused_and_nothing_uploaded(hub_server, hub_api, out):
    hub_api.create_repo(REPO, private=False)
    make_checkpoint(out, 2)
    hub_server.clear_log()
    with pytest.raises(HubError) as e:
        preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url)
    assert e.value.exit_code == exitcodes.HUB_PUBLIC_REPO and "public" in e.value.message
    writes = [r for r in hub_server.request_log() if r["method"] in ("POST", "PUT", "DELETE")]
    assert writes == [] and set(hub_files(hub_server)) == {".gitattributes"}
    assert hub_server.store.meta("models", REPO)["private"] is False  # never flipped behind the user's back


@pytest.mark.parametrize("token, words", [
    (None, "needs HF_TOKEN"),
    ("hf_not_a_real_token_000000000000", "refused"),
    (READ_TOKEN, "read-only"),
])
def test_bad_missing_or_read_only_token_fails_in_preflight(hub_server, token, words):
    with pytest.raises(HubError) as e:
        preflight(REPO, token, endpoint=hub_server.url)
    assert e.value.exit_code == exitcodes.HUB_AUTH and words in e.value.message
    assert not hub_server.store.exists("models", REPO)  # nothing created
    assert token is None or token not in e.value.message


def test_other_namespace_refused(hub_server):
    with pytest.raises(HubError) as e:
        preflight("bob/not-mine", WRITE_TOKEN, endpoint=hub_server.url)
    assert e.value.exit_code == exitcodes.HUB_AUTH and "'bob'" in e.value.message


def test_hub_down_at_start_is_its_own_exit_code(hub_server, monkeypatch):
    monkeypatch.setattr(hub_preflight, "PREFLIGHT_TRIES", 2)
    hub_server.add_fault("status", status=503, path="/api/whoami-v2", count=None)
    with pytest.raises(HubError) as e:
        preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url)
    assert e.value.exit_code == exitcodes.HUB_UNREACHABLE and "start again later" in e.value.message


def test_a_name_the_client_refuses_is_a_setting_not_an_outage(hub_server, monkeypatch):
    """Issue 46: huggingface_hub's own check of the name (HFValidationError, no HTTP answer at all) was read as "the
    Hub did not answer" and exit 10, which a scheduler retries for ever."""
    sleeps = []
    monkeypatch.setattr(hub_preflight.time, "sleep", sleeps.append)
    with pytest.raises(HubError) as e:
        preflight("alice/run--2", WRITE_TOKEN, endpoint=hub_server.url)
    assert e.value.exit_code == exitcodes.BAD_SETTINGS and "SFT_HUB_REPO" in e.value.message
    assert "start again later" not in e.value.message and sleeps == []  # not retried


def test_a_name_the_hub_refuses_to_create_is_a_setting(hub_server):
    hub_server.add_fault("status", status=400, path="/api/repos/create", count=None)
    with pytest.raises(HubError) as e:
        preflight("alice/new-run", WRITE_TOKEN, endpoint=hub_server.url)
    assert e.value.exit_code == exitcodes.BAD_SETTINGS
    assert "refused create_repo(alice/new-run) (BadRequestError" in e.value.message and "SFT_HUB_REPO" in e.value.message


def test_fine_grained_tokens_read_from_whoami():
    me = {"name": "alice", "orgs": [{"name": "lab", "roleInOrg": "write"}],
          "auth": {"accessToken": {"role": "fineGrained", "fineGrained": {"scoped": [
              {"entity": {"type": "user", "name": "alice"}, "permissions": ["repo.content.read", "repo.write"]},
              {"entity": {"type": "org", "name": "lab"}, "permissions": ["repo.content.read"]}]}}}}
    hub_preflight.check_write_access(me, "alice/x")
    with pytest.raises(HubError, match="fine-grained"):
        hub_preflight.check_write_access(me, "lab/x")


# -- the uploader --------------------------------------------------------------------------------


def test_cadence_complete_only_manifest_last(hub_server, make_uploader, out):
    make_checkpoint(out, 2)
    make_checkpoint(out, 4, complete=False)  # a save in progress: never read
    u = make_uploader()
    hub_server.clear_log()
    started = time.monotonic()
    u.start()
    assert wait_for(lambda: f"checkpoints/checkpoint-2/{MANIFEST}" in hub_files(hub_server))
    first = time.monotonic() - started
    assert first >= INTERVAL * 0.9, f"uploaded {first:.2f} s after start, before the interval"
    time.sleep(INTERVAL * 1.5)
    assert not any(p.startswith("checkpoints/checkpoint-4/") for p in hub_files(hub_server))  # incomplete: not read
    complete_checkpoint(out / "checkpoint-4")
    done = time.monotonic()
    assert wait_for(lambda: f"checkpoints/checkpoint-4/{MANIFEST}" in hub_files(hub_server))
    assert time.monotonic() - done <= INTERVAL + 3  # at the next round, not much later

    # The manifest goes up last, in a commit of its own, after every file it lists is there.
    history = commits(hub_server)
    for step in (2, 4):
        manifest = manifest_on_hub(hub_server, step)
        assert set(manifest["files"]) == set(layout(step))
        at = next(i for i, c in enumerate(history) if f"checkpoints/checkpoint-{step}/{MANIFEST}" in c["files"])
        before = history[at - 1]["files"]
        for rel, entry in manifest["files"].items():
            assert before[f"checkpoints/checkpoint-{step}/{rel}"]["sha256"] == entry["sha256"]
            assert before[f"checkpoints/checkpoint-{step}/{rel}"]["size"] == entry["size"]
        assert set(history[at]["files"]) - set(before) == {f"checkpoints/checkpoint-{step}/{MANIFEST}"}
    # ... and in the server's request log: the LFS uploads, then the files commit, then the manifest's.
    log = [(r["method"], r["path"]) for r in hub_server.request_log() if r["status"] == 200]
    commit_at = [i for i, (m, p) in enumerate(log) if m == "POST" and p.endswith("/commit/main")]
    puts = [i for i, (m, p) in enumerate(log) if m == "PUT" and p.startswith("/_lfs/upload/")]
    assert len(commit_at) == 4
    for files_commit, manifest_commit, earlier in ((commit_at[0], commit_at[1], -1), (commit_at[2], commit_at[3],
                                                                                     commit_at[1])):
        assert any(earlier < i < files_commit for i in puts)  # the files' LFS uploads, before their commit
        assert not any(files_commit < i < manifest_commit for i in puts)  # nothing between: the manifest is last


def test_manifest_lists_every_file_with_size_and_sha256(hub_server, make_uploader, out):
    folder = make_checkpoint(out, 6)
    u = make_uploader()
    assert u.flush(20)
    manifest = manifest_on_hub(hub_server, 6)
    local = tree(folder)
    assert set(manifest["files"]) == set(local)
    import hashlib
    for rel, data in local.items():
        assert manifest["files"][rel] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert hub_server.store.read_file(REPO, f"checkpoints/checkpoint-6/{rel}") == data


def test_newest_complete_wins_over_older_waiting(hub_server, make_uploader, out):
    for step in (2, 4, 6):
        make_checkpoint(out, step)
    make_checkpoint(out, 8, complete=False)
    u = make_uploader()
    u.start()
    assert wait_for(lambda: f"checkpoints/checkpoint-6/{MANIFEST}" in hub_files(hub_server))
    time.sleep(INTERVAL * 1.5)
    steps = {p.split("/")[1] for p in hub_files(hub_server) if p.startswith("checkpoints/")}
    assert steps == {"checkpoint-6"}


def test_never_two_uploads_at_once(hub_server, make_uploader, out, target, monkeypatch):
    """A slow upload is not started twice; a flush meanwhile waits; the newest then wins over the middle one."""
    active, peak, lock = [0], [0], threading.Lock()
    real = target.api.create_commit

    def counting(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(target.api, "create_commit", counting)
    make_checkpoint(out, 2)
    hub_server.add_fault("stall", method="PUT", path="/_lfs/upload/", seconds=1.5, count=1)
    u = make_uploader(interval=0.3)
    u.start()
    assert wait_for(lambda: hub_server.request_log(method="PUT") != [], 10)
    make_checkpoint(out, 4)  # while checkpoint-2 is still going up
    make_checkpoint(out, 6)
    flushed = []
    t = threading.Thread(target=lambda: flushed.append(u.flush(20)))
    t.start()
    t.join(30)
    assert flushed == [True] and peak[0] == 1
    steps = {p.split("/")[1] for p in hub_files(hub_server) if p.startswith("checkpoints/") and p.endswith(MANIFEST)}
    assert "checkpoint-6" in steps and "checkpoint-4" not in steps
    assert not any(p.startswith("checkpoints/checkpoint-4/") for c in commits(hub_server) for p in c["files"])


def test_retention_deletes_only_after_the_newer_manifest(hub_server, make_uploader, out, hub_api):
    # a torn upload of an earlier start, by an earlier version of the job (checkpoint-N/ at the root)
    hub_api.create_commit(REPO, [CommitOperationAdd("checkpoint-1/latest", b"global_step1")],
                          commit_message="a torn upload of an earlier start")
    u = make_uploader(keep=2)
    for step in (2, 4, 6):
        make_checkpoint(out, step)
        assert u.flush(20)
    assert wait_for(lambda: not any(p.startswith(("checkpoint-1/", "checkpoints/checkpoint-2/"))
                                    for p in hub_files(hub_server)))
    steps = sorted({p.split("/")[1] for p in hub_files(hub_server) if p.startswith("checkpoints/")})
    assert steps == ["checkpoint-4", "checkpoint-6"]
    history = commits(hub_server)
    manifest6 = next(i for i, c in enumerate(history) if f"checkpoints/checkpoint-6/{MANIFEST}" in c["files"])
    two = f"checkpoints/checkpoint-2/{MANIFEST}"
    gone2 = next(i for i, c in enumerate(history) if i > 0 and two in history[i - 1]["files"] and two not in c["files"])
    assert gone2 > manifest6
    assert any("deleted checkpoint-2" in line for line in u.lines)


def test_retention_frees_storage_only_deleted_checkpoints_used(hub_server, make_uploader, out, target, monkeypatch):
    """Deleting files keeps their LFS objects in history; the purge takes those no kept file shares."""
    from huggingface_hub.hf_api import LFSFileInfo

    def list_lfs_files(repo):  # the Hub's /lfs-files: every object ever pushed, with one path that used it
        seen = {}
        for commit in commits(hub_server, repo):
            for path, entry in commit["files"].items():
                if entry["lfs"] and entry["sha256"] not in seen:
                    seen[entry["sha256"]] = LFSFileInfo(fileOid=entry["sha256"], filename=path, oid=entry["oid"],
                                                        pushedAt="2026-01-01T00:00:00.000Z", size=entry["size"])
        return list(seen.values())

    purged = []
    monkeypatch.setattr(target.api, "list_lfs_files", list_lfs_files)
    monkeypatch.setattr(target.api, "permanently_delete_lfs_files", lambda repo, files: purged.extend(files))
    same = {"training_args.bin": b"\x80\x04 the same arguments in every checkpoint"}  # one LFS object, shared
    u = make_uploader(keep=1)
    make_checkpoint(out, 2, extra=same)
    assert u.flush(20)
    make_checkpoint(out, 4, extra=same)
    assert u.flush(20)
    assert wait_for(lambda: purged, 5)
    assert {f.filename.split("/")[1] for f in purged} == {"checkpoint-2"}
    kept = {e["sha256"] for p, e in hub_files(hub_server).items() if e["lfs"]}
    assert kept and not kept & {f.file_oid for f in purged}  # checkpoint-4's training_args.bin survives
    assert len(purged) == sum(1 for rel in tree(out / "checkpoint-2") if rel.endswith((".pt", ".pth", ".safetensors")))


def test_storage_purge_unsupported_is_a_warning_once(hub_server, make_uploader, out):
    u = make_uploader(keep=1)
    for step in (2, 4, 6):
        make_checkpoint(out, step)
        assert u.flush(20)
    warnings = [line for line in u.lines if "could not free the storage" in line]
    assert len(warnings) == 1 and "404" in warnings[0]
    assert f"checkpoints/checkpoint-6/{MANIFEST}" in hub_files(hub_server)


def test_checkpoint_rotated_away_mid_upload_still_goes_up_whole(hub_server, make_uploader, out):
    import shutil

    original = tree(make_checkpoint(out, 2))
    hub_server.add_fault("stall", method="PUT", path="/_lfs/upload/", seconds=1.0, count=1)
    u = make_uploader(interval=0.2)
    u.start()
    assert wait_for(lambda: hub_server.request_log(method="PUT") != [], 10)
    shutil.rmtree(out / "checkpoint-2")  # the Trainer's save_total_limit rotation
    make_checkpoint(out, 4, complete=False)
    assert wait_for(lambda: f"checkpoints/checkpoint-2/{MANIFEST}" in hub_files(hub_server))
    for rel, data in original.items():
        assert hub_server.store.read_file(REPO, f"checkpoints/checkpoint-2/{rel}") == data
    assert wait_for(lambda: not (out / "run" / "upload-staging" / "checkpoint-2").exists(), 5)


def test_outage_then_catch_up_nothing_lost(hub_server, make_uploader, out):
    """The Hub answers 500 for a while: training goes on, warnings say how far behind, then it catches up."""
    u = make_uploader(interval=0.3, retry_s=0.2)
    make_checkpoint(out, 2)
    assert u.flush(20)
    # The commit endpoint answers 500 (huggingface_hub does not retry it; a 500 on every route would
    # only add the client's own 23 s of retries per round).
    fault = hub_server.add_fault("status", status=500, method="POST", path="/commit/", count=None)
    make_checkpoint(out, 4)
    u.start()
    assert wait_for(lambda: any("behind" in line for line in u.lines), 30)
    make_checkpoint(out, 6)  # training goes on during the outage
    assert wait_for(lambda: any("Hub is 2 checkpoint(s)" in line for line in u.lines), 30)
    assert hub_server.fault(fault)["hits"] >= 2
    hub_server.clear_faults()
    assert u.flush(30)
    assert f"checkpoints/checkpoint-6/{MANIFEST}" in hub_files(hub_server)
    from sft.hub.resume import download_checkpoint

    got = download_checkpoint(u.target.api, REPO, 6, out.parent / "fresh")
    assert tree(got) == {**tree(out / "checkpoint-6"), MANIFEST: hub_server.store.read_file(
        REPO, f"checkpoints/checkpoint-6/{MANIFEST}")}
    status = u.uploaded()
    assert status["last_error"] is None and "checkpoint-6" in status["checkpoints"]


def test_connection_dropped_mid_upload_is_retried(hub_server, make_uploader, out):
    make_checkpoint(out, 2)
    fault = hub_server.add_fault("drop", method="PUT", path="/_lfs/upload/", after_bytes=1000, count=2)
    u = make_uploader()
    assert u.flush(30)
    assert hub_server.fault(fault)["hits"] == 2
    assert f"checkpoints/checkpoint-2/{MANIFEST}" in hub_files(hub_server)


@pytest.mark.parametrize("path, wait", [
    ("/commit/main", 2.0),  # not retried by huggingface_hub: the uploader waits Retry-After itself
    ("/preupload/", 2.0),  # retried by huggingface_hub's http_backoff, which waits Retry-After + 1
])
def test_429_retry_after_honoured(hub_server, make_uploader, out, path, wait):
    make_checkpoint(out, 2)
    fault = hub_server.add_fault("status", status=429, retry_after=int(wait), method="POST", path=path, count=1)
    u = make_uploader(retry_s=0.1)
    started = time.monotonic()
    assert u.flush(30)
    assert time.monotonic() - started >= wait
    assert hub_server.fault(fault)["hits"] == 1
    answered = [r["status"] for r in hub_server.request_log(method="POST", path=path)]
    assert answered[0] == 429 and 200 in answered


def test_write_refused_later_is_said_clearly_and_training_goes_on(hub_server, make_uploader, out):
    make_checkpoint(out, 2)
    hub_server.add_fault("status", status=403, method="POST", path="/preupload/", count=None)
    u = make_uploader(interval=0.3)
    assert u.flush(2) is False
    assert any("refused to write" in line and "training goes on" in line for line in u.lines)


def test_finish_uploads_final_reports_and_card(hub_server, make_uploader, out):
    final = out / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text('{"model_type": "qwen3"}')
    (final / "model.safetensors").write_bytes(os.urandom(30_000))
    run = out / "run"
    summary = {"settings": {"model": "Qwen/Qwen3-8B", "dataset": "trl-lib/Capybara", "dataset_split": "train",
                            "learning_rate": 1e-5, "hub_repo": REPO},
               "stage": "3", "ranks": 8, "status": "done", "final_loss": 0.8125,
               "train": {"global_step": 494, "tokens_per_second": 1234.5}}
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(100))
    u = make_uploader()
    assert u.finish(final, run) == []
    files = hub_files(hub_server)
    # the model at the root, where from_pretrained("owner/repo") and `hf download` look
    assert {"config.json", "model.safetensors", MANIFEST, "run/summary.json", "run/loss.png",
            "README.md"} <= set(files)
    assert not any(p.startswith("final/") for p in files)
    card = hub_server.store.read_file(REPO, "README.md").decode()
    assert "base_model: Qwen/Qwen3-8B" in card and "trl-lib/Capybara" in card and "0.8125" in card
    assert "SFT_LEARNING_RATE" in card and f'from_pretrained("{REPO}")' in card and "subfolder" not in card
    history = commits(hub_server)
    at = next(i for i, c in enumerate(history) if MANIFEST in c["files"])
    assert "model.safetensors" in history[at - 1]["files"]
    assert u.uploaded()["final"] is True


def test_finish_names_what_is_missing(hub_server, make_uploader, out):
    run = out / "run"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    hub_server.add_fault("status", status=500, method="POST", path="/commit/", count=None)
    u = make_uploader()
    missing = u.finish(out / "final", run, timeout_s=3)
    assert len(missing) == 2
    assert missing[0].startswith("final/") and "no saved model" in missing[0]  # OUTPUT/final/, on disk
    assert missing[1].startswith("run reports and model card") and "500" in missing[1]


def test_token_never_logged_written_or_uploaded(hub_server, make_uploader, out, tmp_path, capsys):
    """Search every file written, every blob the Hub stored, and all output for the token."""
    make_checkpoint(out, 2)
    leaky = make_checkpoint(out, 4, extra={"training_args.bin": b"\x80\x04pickle hub_token=" +
                                           WRITE_TOKEN.encode() + b" more"})
    u = make_uploader()
    assert u.flush(3) is False  # checkpoint-4 holds the token: refused, never retried
    assert any("checkpoint-4 not uploaded" in line and "contains the Hub token" in line for line in u.lines)
    assert not any(p.startswith("checkpoints/checkpoint-4/") for c in commits(hub_server) for p in c["files"])
    import shutil
    shutil.rmtree(leaky)
    make_checkpoint(out, 6)
    assert u.flush(20)
    (out / "final").mkdir()
    (out / "final" / "config.json").write_text("{}")
    (out / "run" / "summary.json").write_text(json.dumps({"settings": {"hub_repo": REPO}}))
    assert u.finish(out / "final", out / "run") == []
    token = WRITE_TOKEN.encode()
    for root in (out, hub_server.store.root):
        for path in root.rglob("*"):
            if path.is_file():
                assert token not in path.read_bytes(), path
    captured = capsys.readouterr()
    assert WRITE_TOKEN not in captured.out + captured.err + "\n".join(u.lines)
    assert WRITE_TOKEN not in json.dumps(u.uploaded())


def test_uploaded_reports_bytes_seconds_rate(hub_server, make_uploader, out):
    make_checkpoint(out, 2)
    u = make_uploader()
    assert u.flush(20)
    status = u.uploaded()
    (record,) = status["uploads"]
    size = sum(len(b) for b in tree(out / "checkpoint-2").values())
    assert record["folder"] == "checkpoint-2" and record["bytes"] == size == status["bytes"]
    assert record["seconds"] > 0 and status["mb_per_s"] > 0
    assert status["checkpoints"] == ["checkpoint-2"] and status["behind"].startswith("The Hub has")


def test_fake_layout_matches_a_real_checkpoint():
    """REAL_LAYOUT against a checkpoint the job wrote, when one is at hand (SFT_TEST_REAL_CHECKPOINT)."""
    real = os.environ.get("SFT_TEST_REAL_CHECKPOINT")
    if not real or not Path(real).is_dir():
        pytest.skip("set SFT_TEST_REAL_CHECKPOINT to a checkpoint-N folder the job wrote with two ranks")
    real = Path(real)
    step = checkpoints.step_of(real)
    assert sorted(tree(real)) == sorted(layout(step)) and len(REAL_LAYOUT) == 15
    assert checkpoints.problem(real) is None


# -- watching an upload, and a branch of the repo ------------------------------------------------


def test_progress_shows_bytes_rate_and_eta_while_an_upload_runs_without_flooding(hub_server, target, out):
    """A stalled LFS upload: run/upload.json says how far it got, the log says it every progress_every_s."""
    from sft.events import UploadProgress

    make_checkpoint(out, 2, extra={"global_step2/big_optim_states.pt": os.urandom(24_000_000)})
    hub_server.add_fault("stall", method="PUT", path="/_lfs/upload/", seconds=3.0, count=1)
    lines: list[str] = []
    u = Uploader(target, out, interval_s=60, keep=2, retry_s=0.2, log=lines.append, progress_every_s=1.0)
    seen: list[UploadProgress] = []
    flushed = []
    t = threading.Thread(target=lambda: flushed.append(u.flush(60)))
    started = time.monotonic()
    t.start()
    while t.is_alive():
        now = UploadProgress.load(out / "run" / "upload.json")
        if now is not None and now.phase == "uploading":
            seen.append(now)
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    u.stop(5)
    assert flushed == [True]
    total = sum(len(b) for b in tree(out / "checkpoint-2").values())
    assert seen and all(p.folder == "checkpoint-2" and p.bytes_total == total for p in seen)
    assert any(0 < p.bytes_sent < total for p in seen)  # partway: the server holds the request, unread
    progress = [line for line in lines if "checkpoint-2: uploading" in line]
    assert progress and all("MB of" in line and "%" in line for line in progress)
    assert any("MB/s" in line and "s left" in line for line in progress)
    assert len(progress) <= elapsed / 1.0 + 1  # one line a period at most, not one per file or per chunk
    assert UploadProgress.load(out / "run" / "upload.json").phase == "done"


def test_uploads_go_to_the_branch_sft_hub_revision_names(hub_server, out, tmp_path):
    branch_target = preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url, revision="run-2")
    u = Uploader(branch_target, out, interval_s=60, keep=2, retry_s=0.2, log=lambda line: None)
    make_checkpoint(out, 2)
    assert u.flush(20)
    final = out / "final"
    final.mkdir()
    (final / "config.json").write_text('{"model_type": "qwen3"}')
    (out / "run" / "summary.json").write_text(json.dumps({"settings": {"hub_repo": REPO}, "status": "done"}))
    assert u.finish(final, out / "run") == []
    on_branch = hub_server.store.files("models", REPO, "run-2")[1]
    assert {f"checkpoints/checkpoint-2/{MANIFEST}", MANIFEST, "config.json", "README.md"} <= set(on_branch)
    assert set(hub_files(hub_server)) == {".gitattributes"}  # main untouched
    card = hub_server.store.read_file(REPO, "README.md", revision="run-2").decode()
    assert f'from_pretrained("{REPO}", revision="run-2")' in card
    # a second start finds the branch there, and its final model done; main's is not
    again = preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url, revision="run-2")
    from sft.hub.resume import final_on_hub

    assert final_on_hub(again.api, REPO, "run-2") and not final_on_hub(again.api, REPO)


def test_at_the_end_the_final_model_goes_up_not_the_checkpoint_saved_since_the_last_round(hub_server, make_uploader,
                                                                                          out):
    """final/ is the end checkpoint's model files; its optimizer state only resumes a run, which a finished one is
    not: finish() sends final/ and the reports, and the exit is not held for the newest checkpoint's upload."""
    u = make_uploader(interval=60)
    make_checkpoint(out, 2)
    assert u.flush(20)
    make_checkpoint(out, 4)  # saved at the end, after the uploader's last round
    (out / "final").mkdir()
    (out / "final" / "config.json").write_text('{"model_type": "qwen3"}')
    (out / "run" / "summary.json").write_text(json.dumps({"settings": {"hub_repo": REPO}, "status": "done"}))
    assert u.finish(out / "final", out / "run") == []
    files = set(hub_files(hub_server))
    assert {f"checkpoints/checkpoint-2/{MANIFEST}", MANIFEST, "config.json", "README.md"} <= files
    assert not any(f.startswith("checkpoints/checkpoint-4/") for f in files)
