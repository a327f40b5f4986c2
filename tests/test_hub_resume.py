"""sft/hub/resume.py: a fresh disk resumes from the newest whole checkpoint on the (local) Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete

from checkpoint_layout import make_checkpoint, tree
from hub_fixtures import WRITE_TOKEN, hub_api, hub_server  # noqa: F401  (fixtures)
from sft import checkpoints, exitcodes
from sft.hub import resume as hub_resume
from sft.hub.errors import HubError
from sft.hub.layout import MANIFEST, hub_checkpoints
from sft.hub.manifest import build_manifest, verify
from sft.hub.preflight import preflight
from sft.hub.uploader import Uploader

REPO = "alice/sft-run"


@pytest.fixture
def target(hub_server):
    return preflight(REPO, WRITE_TOKEN, endpoint=hub_server.url)


@pytest.fixture
def on_hub(target, tmp_path):
    """Checkpoints 2, 4 and 6 uploaded through the Uploader from an old disk; returns that disk's folder."""
    old = tmp_path / "old-disk"
    u = Uploader(target, old, interval_s=60, keep=3, retry_s=0.2, log=lambda line: None)
    for step in (2, 4, 6):
        make_checkpoint(old, step, seed=step)
        assert u.flush(20)
    u.stop(5)
    return old


def _without_manifest(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree(folder).items() if k != MANIFEST}


def test_newest_complete_on_hub(target, on_hub):
    assert hub_checkpoints(target.api.list_repo_files(REPO))[0][-1] == 6
    assert hub_resume.final_on_hub(target.api, REPO) is False


def test_fresh_disk_resumes_from_the_newest_verified(target, on_hub, tmp_path):
    fresh = tmp_path / "fresh"
    lines = []
    got = hub_resume.resume_from_hub(target.api, REPO, fresh, log=lines.append)
    assert got == fresh / "checkpoint-6"
    assert _without_manifest(got) == tree(on_hub / "checkpoint-6")
    assert checkpoints.latest_complete(fresh) == got  # what the Trainer is then handed
    assert not (fresh / "run" / hub_resume.DOWNLOAD_DIR).exists()
    assert any("checkpoint-6 downloaded" in line and "verified" in line for line in lines)


def test_torn_checkpoint_without_manifest_skipped(target, on_hub, tmp_path):
    """The job was killed while checkpoint-8 went up: its files are there, its manifest is not."""
    make_checkpoint(on_hub, 8)
    ops = [CommitOperationAdd(f"checkpoints/checkpoint-8/{rel}", data)
           for rel, data in tree(on_hub / "checkpoint-8").items() if rel != "trainer_state.json"]
    target.api.create_commit(REPO, ops, commit_message="checkpoint-8: cut off")
    lines = []
    got = hub_resume.resume_from_hub(target.api, REPO, tmp_path / "fresh", log=lines.append)
    assert got.name == "checkpoint-6"
    assert any("checkpoint-8" in line and "no manifest" in line for line in lines)


@pytest.mark.parametrize("damage", ["changed", "missing", "resized"])
def test_file_differing_from_manifest_skipped_for_the_previous(target, on_hub, tmp_path, damage):
    rel = "global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = (on_hub / "checkpoint-6" / rel).read_bytes()
    if damage == "missing":
        op = CommitOperationDelete(f"checkpoints/checkpoint-6/{rel}")
    else:
        bad = bytes([data[0] ^ 0xFF]) + data[1:] if damage == "changed" else data + b"\0"
        op = CommitOperationAdd(f"checkpoints/checkpoint-6/{rel}", bad)
    target.api.create_commit(REPO, [op], commit_message=f"checkpoint-6: a file {damage}")
    lines = []
    fresh = tmp_path / "fresh"
    got = hub_resume.resume_from_hub(target.api, REPO, fresh, log=lines.append)
    assert got == fresh / "checkpoint-4"
    assert _without_manifest(got) == tree(on_hub / "checkpoint-4")
    assert not (fresh / "checkpoint-6").exists()  # a torn download never lands in the output folder
    word = {"changed": "sha256", "missing": "missing", "resized": "bytes"}[damage]
    assert any("checkpoint-6" in line and "torn" in line and word in line for line in lines)


def test_small_git_file_differing_from_manifest_is_caught_after_the_download(target, on_hub, tmp_path):
    """The Hub records no sha256 for a small file it keeps in git: the manifest catches it after the download."""
    target.api.create_commit(REPO, [CommitOperationAdd("checkpoints/checkpoint-6/latest", b"global_step3")],  # same size
                             commit_message="checkpoint-6: latest changed")
    lines = []
    got = hub_resume.resume_from_hub(target.api, REPO, tmp_path / "fresh", log=lines.append)
    assert got.name == "checkpoint-4"
    assert any("checkpoint-6" in line and "torn" in line and "latest: sha256 differs from the manifest" in line
               for line in lines)


def test_bytes_the_hub_serves_unlike_its_own_record_are_caught(target, on_hub, hub_server, tmp_path):
    """Bytes served that do not match the Hub's sha256 (storage gone bad) never land: each file is hashed against the
    manifest, whose sha256 is the Hub's record."""
    rel = "global_step6/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    blob = hub_server.store.blob_path(build_manifest(on_hub / "checkpoint-6")[0]["files"][rel]["sha256"])
    data = blob.read_bytes()
    blob.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # same size: only hashing tells
    lines = []
    fresh = tmp_path / "fresh"
    got = hub_resume.resume_from_hub(target.api, REPO, fresh, log=lines.append)
    assert got == fresh / "checkpoint-4"
    assert not (fresh / "checkpoint-6").exists()
    assert any("checkpoint-6" in line and "torn" in line and f"{rel}: its sha256 differs from the Hub's record"
               in line for line in lines), lines


def test_verify_checks_sizes_and_sha256(tmp_path):
    folder = make_checkpoint(tmp_path, 2)
    manifest, _ = build_manifest(folder)
    assert verify(folder, manifest) == []
    (folder / "latest").write_bytes(b"global_step3")  # same size, other content
    (folder / "scheduler.pt").unlink()
    problems = verify(folder, manifest)
    assert problems == ["scheduler.pt is missing", "latest: sha256 differs from the manifest"]


def test_download_replaces_an_incomplete_local_copy(target, on_hub, tmp_path):
    fresh = tmp_path / "fresh"
    make_checkpoint(fresh, 6, complete=False, seed=99)  # a save cut off on this disk
    got = hub_resume.download_checkpoint(target.api, REPO, 6, fresh)
    assert _without_manifest(got) == tree(on_hub / "checkpoint-6")


def test_nothing_on_hub(target, tmp_path):
    assert hub_checkpoints(target.api.list_repo_files(REPO))[0] == []
    assert hub_resume.resume_from_hub(target.api, REPO, tmp_path / "fresh", log=lambda line: None) is None


@pytest.mark.parametrize("folder", ["", "final/"])  # the root; final/, where an earlier version of the job put it
def test_final_on_hub_only_with_its_manifest(target, tmp_path, folder):
    target.api.create_commit(REPO, [CommitOperationAdd(f"{folder}config.json", b"{}")], commit_message="final: files")
    assert hub_resume.final_on_hub(target.api, REPO) is False
    body = json.dumps({"files": {"config.json": {"size": 2, "sha256": "x"}}}).encode()
    target.api.create_commit(REPO, [CommitOperationAdd(f"{folder}{MANIFEST}", body)], commit_message="final: manifest")
    assert hub_resume.final_on_hub(target.api, REPO) is True


def test_a_checkpoint_in_an_earlier_versions_layout_still_resumes(target, tmp_path):
    """checkpoint-N/ at the repo's root, as the job wrote it before checkpoints/: found, verified, resumed."""
    old = make_checkpoint(tmp_path / "old-disk", 10, seed=10)
    manifest, _ = build_manifest(old)
    ops = [CommitOperationAdd(f"checkpoint-10/{rel}", data) for rel, data in tree(old).items()]
    target.api.create_commit(REPO, ops, commit_message="checkpoint-10: files")
    target.api.create_commit(REPO, [CommitOperationAdd(f"checkpoint-10/{MANIFEST}", json.dumps(manifest).encode())],
                             commit_message="checkpoint-10: manifest")
    assert hub_checkpoints(target.api.list_repo_files(REPO))[0] == [10]
    got = hub_resume.resume_from_hub(target.api, REPO, tmp_path / "fresh", log=lambda line: None)
    assert got == tmp_path / "fresh" / "checkpoint-10" and _without_manifest(got) == tree(old)


def test_hub_failure_is_an_error_not_a_silent_fresh_start(target, on_hub, hub_server, tmp_path):
    hub_server.add_fault("status", status=401, method="GET", path="/tree/", count=None)  # token revoked
    with pytest.raises(HubError) as e:
        hub_resume.resume_from_hub(target.api, REPO, tmp_path / "fresh", log=lambda line: None)
    assert e.value.exit_code == exitcodes.HUB_UNREACHABLE and WRITE_TOKEN not in e.value.message
