"""The local Hub server (tests/hubserver/) driven by the real huggingface_hub client.

Besides checking the server, these tests pin down what the client (2.4.0) does by itself on
errors: which requests it retries and which surface to the caller. Every request goes to
127.0.0.1; hub_fixtures.configure_client points the already-imported library at the server.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_fixtures import (  # noqa: E402
    READ_TOKEN,
    WRITE_TOKEN,
    configure_client,
    hub_api,  # noqa: F401  (fixture)
    hub_process,  # noqa: F401  (fixture)
    hub_server,  # noqa: F401  (fixture)
    not_yet,
)
from hubserver import LFS_THRESHOLD, HubError, RepoStore  # noqa: E402

from huggingface_hub import (  # noqa: E402
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    ModelCard,
    constants,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (  # noqa: E402
    BadRequestError,
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)

REPO = "alice/tiny-sft"
BIG_SIZE = LFS_THRESHOLD + 512 * 1024  # just over the 10 MB LFS threshold
LFS_BATCH = ".git/info/lfs/objects/batch"


def _bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """A training output folder: small regular files, one big file, two checkpoints."""
    folder = tmp_path / "run"
    files = {
        "config.json": b'{"model_type": "llama"}\n',
        "model.dat": _bytes(BIG_SIZE, 1),  # LFS because of its size
        "checkpoint-2/trainer_state.json": b'{"global_step": 2}\n',
        "checkpoint-2/optimizer.pt": _bytes(4096, 2),  # LFS because of the .gitattributes pattern
        "checkpoint-4/trainer_state.json": b'{"global_step": 4}\n',
        "checkpoint-4/optimizer.pt": _bytes(4096, 3),
        "checkpoint-4/notes.txt": b"step 4\n",
    }
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def uploaded(hub_api, hub_server, run_folder):
    """REPO created (private) and `run_folder` uploaded to it; the log starts empty."""
    hub_api.create_repo(REPO, private=True)
    hub_api.upload_folder(repo_id=REPO, folder_path=run_folder)
    hub_server.clear_log()
    return run_folder


def _statuses(server, method: str, path: str) -> list:
    return [e["status"] for e in server.request_log(method=method, path=path)]


def _head(server, repo_id: str = REPO) -> str:
    return server.store.resolve("models", repo_id, "main")


# --------------------------------------------------------------------------------------------
# Auth and repos
# --------------------------------------------------------------------------------------------


def test_whoami_reports_user_and_token_role(hub_server):
    for token, role in ((WRITE_TOKEN, "write"), (READ_TOKEN, "read")):
        info = HfApi(endpoint=hub_server.url, token=token).whoami()
        assert info["name"] == "alice"
        assert info["auth"]["accessToken"]["role"] == role


def test_whoami_with_unknown_token_is_401_and_tokens_are_never_logged(hub_server):
    with pytest.raises(HfHubHTTPError) as excinfo:
        HfApi(endpoint=hub_server.url, token="hf_not_a_real_token").whoami()
    assert excinfo.value.response.status_code == 401
    assert "Invalid user token" in str(excinfo.value)
    HfApi(endpoint=hub_server.url, token=WRITE_TOKEN).whoami()

    log = json.dumps(hub_server.request_log())
    assert "hf_not_a_real_token" not in log and WRITE_TOKEN not in log
    assert _statuses(hub_server, "GET", "/api/whoami-v2") == [401, 200]


def test_repo_privacy_and_settings_update(hub_api, hub_server):
    hub_api.create_repo(REPO, private=True)
    assert hub_api.repo_info(REPO).private is True
    anonymous = HfApi(endpoint=hub_server.url, token=False)
    with pytest.raises(RepositoryNotFoundError):
        anonymous.repo_info(REPO)  # private repos are hidden, like on the Hub

    hub_api.update_repo_settings(REPO, private=False)
    assert hub_api.repo_info(REPO).private is False
    assert anonymous.repo_info(REPO).private is False

    hub_api.update_repo_settings(REPO, visibility="private")
    assert hub_api.repo_info(REPO).private is True


def test_create_repo_conflict_and_exist_ok(hub_api, hub_server):
    url = hub_api.create_repo(REPO, private=True)
    assert url.repo_id == REPO and url.endpoint == hub_server.url
    assert hub_api.create_repo(REPO, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as excinfo:
        hub_api.create_repo(REPO)
    assert excinfo.value.response.status_code == 409

    reader = HfApi(endpoint=hub_server.url, token=READ_TOKEN)
    # The client turns the 403 into a repo_info call when exist_ok=True and the repo exists.
    assert reader.create_repo(REPO, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as excinfo:
        reader.create_repo("alice/another")
    assert excinfo.value.response.status_code == 403


def test_read_only_token_gets_403_on_writes(uploaded, hub_server):
    reader = HfApi(endpoint=hub_server.url, token=READ_TOKEN)
    assert "config.json" in reader.list_repo_files(REPO)  # reading a private repo of its user is fine
    head = _head(hub_server)

    with pytest.raises(HfHubHTTPError) as excinfo:
        reader.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO)
    assert excinfo.value.response.status_code == 403  # refused at preupload
    with pytest.raises(HfHubHTTPError) as excinfo:
        reader.create_commit(REPO, [CommitOperationDelete("config.json")], commit_message="rm")
    assert excinfo.value.response.status_code == 403
    assert _statuses(hub_server, "POST", "/commit/main") == [403]
    assert _head(hub_server) == head


# --------------------------------------------------------------------------------------------
# Uploads, listings, downloads
# --------------------------------------------------------------------------------------------


def test_upload_folder_sends_big_and_binary_files_through_lfs(hub_api, hub_server, run_folder):
    hub_api.create_repo(REPO, private=True)
    hub_api.upload_folder(repo_id=REPO, folder_path=run_folder, commit_message="step 4")

    assert _statuses(hub_server, "POST", LFS_BATCH) == [200]
    puts = hub_server.request_log(method="PUT", path="/_lfs/upload/")
    assert sorted(int(e["content_length"]) for e in puts) == [4096, 4096, BIG_SIZE]
    assert _statuses(hub_server, "POST", "/commit/main") == [200]

    tree = {item.path: item for item in hub_api.list_repo_tree(REPO, recursive=True)}
    assert tree["model.dat"].lfs.size == BIG_SIZE
    assert tree["checkpoint-2/optimizer.pt"].lfs is not None
    assert tree["config.json"].lfs is None and tree["checkpoint-4/notes.txt"].lfs is None
    expected = {p.relative_to(run_folder).as_posix() for p in run_folder.rglob("*") if p.is_file()}
    assert set(hub_api.list_repo_files(REPO)) == expected | {".gitattributes"}
    assert hub_server.store.read_file(REPO, "model.dat") == (run_folder / "model.dat").read_bytes()

    assert hub_api.file_exists(REPO, "checkpoint-4/notes.txt")
    assert not hub_api.file_exists(REPO, "checkpoint-9/notes.txt")
    infos = hub_api.get_paths_info(REPO, ["config.json", "checkpoint-4", "missing.txt"])
    assert [i.path for i in infos] == ["config.json", "checkpoint-4"]


def test_reupload_of_unchanged_files_skips_them(uploaded, hub_api, hub_server):
    hub_api.upload_file(path_or_fileobj=uploaded / "model.dat", path_in_repo="model.dat", repo_id=REPO)
    assert hub_server.request_log(method="PUT") == []  # preupload returned the same oid
    assert hub_server.request_log(method="POST", path="/commit/") == []  # nothing to commit


def test_create_commit_deletes_a_checkpoint_folder(uploaded, hub_api, hub_server):
    hub_api.create_commit(
        REPO,
        [CommitOperationDelete("checkpoint-2/"), CommitOperationAdd("checkpoint-4/extra.txt", b"more\n")],
        commit_message="rotate checkpoints",
    )
    files = hub_api.list_repo_files(REPO)
    assert not any(f.startswith("checkpoint-2/") for f in files)
    assert "checkpoint-4/extra.txt" in files and "checkpoint-4/optimizer.pt" in files
    titles = [c.title for c in hub_api.list_repo_commits(REPO)]
    assert titles == ["rotate checkpoints", "Upload folder using huggingface_hub", "initial commit"]

    head = _head(hub_server)
    with pytest.raises(EntryNotFoundError):
        hub_api.delete_file("checkpoint-2/optimizer.pt", repo_id=REPO)
    assert _head(hub_server) == head


# --------------------------------------------------------------------------------------------
# Model card metadata: POST /api/validate-yaml, called by create_commit for a README.md
# --------------------------------------------------------------------------------------------

VALID_CARD = "---\nlicense: apache-2.0\nlibrary_name: transformers\ntags:\n- sft\n---\n\n# A model\n"
INVALID_CARDS = {  # README.md -> what the error must say
    "---\nlicense: mit\ntags: [sft\n---\n\nbroken flow list\n": "Invalid YAML in the metadata, line 3",
    "---\nmodel-index: foo\n---\n\nwrong type\n": '"model-index" must be an array',
    "---\n- just\n- a list\n---\n": "must be a YAML mapping",
}


def test_commit_with_a_valid_model_card_is_validated_then_committed(hub_api, hub_server, recwarn):
    hub_api.create_repo(REPO)
    hub_server.clear_log()
    hub_api.create_commit(REPO, [CommitOperationAdd("README.md", VALID_CARD.encode()),
                                 CommitOperationAdd("config.json", b"{}\n")], commit_message="card")
    assert hub_server.store.read_file(REPO, "README.md").decode() == VALID_CARD
    paths = [(e["method"], e["path"], e["status"]) for e in hub_server.request_log()]
    assert paths[0] == ("POST", "/api/validate-yaml", 200)  # before anything is uploaded
    assert hub_server.request_log(path="/api/validate-yaml")[0]["user"] == "alice"
    assert not [w for w in recwarn if "metadata" in str(w.message)]

    hub_api.create_commit(REPO, [CommitOperationAdd("README.md", b"# No front matter\n")], commit_message="bare")
    assert [str(w.message) for w in recwarn if "empty or missing yaml metadata" in str(w.message)]
    assert _statuses(hub_server, "POST", "/api/validate-yaml") == [200, 200]


@pytest.mark.parametrize("content", list(INVALID_CARDS))
def test_commit_with_invalid_card_metadata_fails_before_uploading(hub_api, hub_server, tmp_path, content):
    hub_api.create_repo(REPO)
    head = _head(hub_server)
    hub_server.clear_log()
    with pytest.raises(ValueError, match="Invalid metadata in README.md") as excinfo:
        hub_api.create_commit(REPO, [CommitOperationAdd("README.md", content.encode()),
                                     CommitOperationAdd("model.dat", _bytes(BIG_SIZE, 7))], commit_message="x")
    assert INVALID_CARDS[content] in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, BadRequestError)
    assert excinfo.value.__cause__.response.json()["errors"][0]["message"] in str(excinfo.value)
    assert [(e["path"], e["status"]) for e in hub_server.request_log()] == [("/api/validate-yaml", 400)]
    assert _head(hub_server) == head

    folder = tmp_path / "folder"  # upload_folder validates a README.md before hashing anything
    folder.mkdir()
    (folder / "README.md").write_text(content)
    with pytest.raises(ValueError, match="Invalid metadata in README.md"):
        hub_api.upload_folder(repo_id=REPO, folder_path=folder)
    assert _head(hub_server) == head

    # What RepoCard.validate sends (it re-renders the card, so post the raw text like it does).
    response = httpx2.post(hub_server.url + "/api/validate-yaml", headers={"Accept": "text/plain"},
                           json={"repoType": "model", "content": content})
    assert response.status_code == 400 and INVALID_CARDS[content] in response.text
    assert response.headers["Content-Type"].startswith("text/plain")


def test_repocard_validate_raises_the_servers_message(hub_server):
    ModelCard(VALID_CARD).validate()  # anonymous, Accept: text/plain; no exception
    with pytest.raises(ValueError, match='"license" must be a string'):
        ModelCard("---\nlicense: 3\n---\n\nnumeric license\n").validate()


def test_validate_yaml_refuses_unknown_tokens_and_bad_requests(hub_server):
    with pytest.raises(HfHubHTTPError) as excinfo:
        HfApi(endpoint=hub_server.url, token="hf_not_a_real_token")._validate_yaml(VALID_CARD)
    assert excinfo.value.response.status_code == 401
    for body in ({"content": 3}, {"content": VALID_CARD, "repoType": "bucket"}):
        response = httpx2.post(hub_server.url + "/api/validate-yaml", json=body)
        assert response.status_code == 400 and "\n" not in response.headers["X-Error-Message"]


def test_snapshot_download_allow_patterns_is_byte_identical(uploaded, hub_server, tmp_path):
    path = Path(snapshot_download(REPO, allow_patterns="checkpoint-4/*", endpoint=hub_server.url,
                                  token=WRITE_TOKEN, cache_dir=tmp_path / "cache"))  # fmt: skip
    got = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    want = {p.relative_to(uploaded).as_posix(): p.read_bytes() for p in (uploaded / "checkpoint-4").rglob("*")}
    assert got == want


def test_download_old_revision_and_large_file(uploaded, hub_api, hub_server, tmp_path):
    first = _head(hub_server)
    hub_api.delete_folder("checkpoint-2", repo_id=REPO)
    path = hf_hub_download(REPO, "checkpoint-2/optimizer.pt", revision=first, endpoint=hub_server.url,
                           token=WRITE_TOKEN, cache_dir=tmp_path / "cache")  # fmt: skip
    assert Path(path).read_bytes() == (uploaded / "checkpoint-2/optimizer.pt").read_bytes()
    path = hf_hub_download(REPO, "model.dat", endpoint=hub_server.url, token=WRITE_TOKEN,
                           local_dir=tmp_path / "local")  # fmt: skip
    assert Path(path).read_bytes() == (uploaded / "model.dat").read_bytes()


def test_tree_listing_is_paginated(uploaded, hub_api, hub_server):
    hub_server.page_size = 2
    assert len(hub_api.list_repo_files(REPO)) == 8
    assert len(hub_server.request_log(method="GET", path="/tree/")) > 1


# --------------------------------------------------------------------------------------------
# Faults: what the client retries by itself and what it surfaces
# --------------------------------------------------------------------------------------------


def test_500_on_preupload_is_retried_by_the_client(uploaded, hub_api, hub_server):
    fault = hub_server.add_fault(status=500, method="POST", path="/preupload/")
    hub_api.upload_file(path_or_fileobj=b"hello\n", path_in_repo="hello.txt", repo_id=REPO)
    assert hub_server.fault(fault)["hits"] == 1
    assert _statuses(hub_server, "POST", "/preupload/") == [500, 200]
    assert hub_server.store.read_file(REPO, "hello.txt") == b"hello\n"


def test_503_on_lfs_put_is_retried_by_the_client(hub_api, hub_server, tmp_path):
    hub_api.create_repo(REPO)
    big = tmp_path / "model.dat"
    big.write_bytes(_bytes(BIG_SIZE, 7))
    hub_server.add_fault(status=503, method="PUT", path="/_lfs/upload/")
    hub_api.upload_file(path_or_fileobj=big, path_in_repo="model.dat", repo_id=REPO)
    assert _statuses(hub_server, "PUT", "/_lfs/upload/") == [503, 200]
    assert hub_server.store.read_file(REPO, "model.dat") == big.read_bytes()


def test_500_on_commit_is_not_retried(uploaded, hub_api, hub_server):
    head = _head(hub_server)
    hub_server.add_fault(status=500, path="/commit/")
    with pytest.raises(HfHubHTTPError) as excinfo:
        hub_api.upload_file(path_or_fileobj=b"x\n", path_in_repo="x.txt", repo_id=REPO)
    assert excinfo.value.response.status_code == 500
    assert _statuses(hub_server, "POST", "/commit/") == [500]
    assert _head(hub_server) == head


def test_429_with_retry_after_is_honoured_on_lfs_batch(hub_api, hub_server, tmp_path):
    hub_api.create_repo(REPO)
    big = tmp_path / "model.dat"
    big.write_bytes(_bytes(BIG_SIZE, 8))
    hub_server.add_fault(status=429, retry_after=0, path=LFS_BATCH)
    started = time.monotonic()
    hub_api.upload_file(path_or_fileobj=big, path_in_repo="model.dat", repo_id=REPO)
    assert time.monotonic() - started >= 1.0  # the client waits Retry-After + 1 s
    assert _statuses(hub_server, "POST", LFS_BATCH) == [429, 200]


def test_429_on_whoami_is_not_retried_and_carries_retry_after(hub_server):
    hub_server.add_fault(status=429, retry_after=7, path="/api/whoami-v2")
    with pytest.raises(HfHubHTTPError) as excinfo:
        HfApi(endpoint=hub_server.url, token=WRITE_TOKEN).whoami()
    assert excinfo.value.response.status_code == 429
    assert excinfo.value.response.headers["Retry-After"] == "7"
    assert _statuses(hub_server, "GET", "/api/whoami-v2") == [429]


def test_connection_dropped_mid_lfs_upload_is_retried(hub_api, hub_server, tmp_path):
    hub_api.create_repo(REPO)
    big = tmp_path / "model.dat"
    big.write_bytes(_bytes(BIG_SIZE, 9))
    fault = hub_server.add_fault("drop", method="PUT", path="/_lfs/upload/", after_bytes=1024 * 1024)
    hub_api.upload_file(path_or_fileobj=big, path_in_repo="model.dat", repo_id=REPO)
    puts = hub_server.request_log(method="PUT", path="/_lfs/upload/")
    assert [(e["fault"], e["status"]) for e in puts] == [("drop", None), (None, 200)]
    assert hub_server.fault(fault)["hits"] == 1
    assert hub_server.store.read_file(REPO, "model.dat") == big.read_bytes()


def test_connection_dropped_mid_commit_surfaces_as_an_exception(uploaded, hub_api, hub_server):
    head = _head(hub_server)
    hub_server.add_fault("drop", path="/commit/", after_bytes=10)
    with pytest.raises(httpx2.TransportError):  # RemoteProtocolError / ReadError / WriteError
        hub_api.upload_file(path_or_fileobj=b"x\n", path_in_repo="x.txt", repo_id=REPO)
    assert [e["fault"] for e in hub_server.request_log(path="/commit/")] == ["drop"]
    assert _head(hub_server) == head


def test_500_on_download_head_is_retried_but_500_on_get_is_not(uploaded, hub_server, tmp_path):
    hub_server.add_fault(status=500, method="HEAD", path="/resolve/")
    kwargs = {"endpoint": hub_server.url, "token": WRITE_TOKEN, "cache_dir": tmp_path / "cache"}
    hf_hub_download(REPO, "config.json", **kwargs)
    assert _statuses(hub_server, "HEAD", "/resolve/") == [500, 200]

    hub_server.clear_log()
    hub_server.add_fault(status=500, method="GET", path="/resolve/")
    with pytest.raises(HfHubHTTPError) as excinfo:
        hf_hub_download(REPO, "checkpoint-4/notes.txt", **kwargs)
    assert excinfo.value.response.status_code == 500
    assert _statuses(hub_server, "GET", "/resolve/") == [500]


def test_500_on_snapshot_repo_info_is_not_retried(uploaded, hub_server, tmp_path):
    hub_server.add_fault(status=500, method="GET", path=f"/api/models/{REPO}/revision/main")
    with pytest.raises(LocalEntryNotFoundError):  # nothing cached to fall back to
        snapshot_download(REPO, endpoint=hub_server.url, token=WRITE_TOKEN, cache_dir=tmp_path / "cache")
    assert _statuses(hub_server, "GET", f"/api/models/{REPO}") == [500]


def test_stalled_metadata_request_times_out_then_is_retried(uploaded, hub_server, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)  # what HF_HUB_ETAG_TIMEOUT=1 gives
    fault = hub_server.add_fault("stall", method="HEAD", path="/resolve/", seconds=4)
    started = time.monotonic()
    path = hf_hub_download(REPO, "config.json", endpoint=hub_server.url, token=WRITE_TOKEN,
                           cache_dir=tmp_path / "cache")  # fmt: skip
    assert time.monotonic() - started < 4  # gave up on the stalled HEAD after ~1 s
    assert Path(path).read_bytes() == (uploaded / "config.json").read_bytes()
    assert hub_server.fault(fault)["hits"] == 1
    assert [e["fault"] for e in hub_server.request_log(method="HEAD")] == ["stall", None]


@pytest.mark.parametrize("cut_at", [3 * 1024 * 1024, constants.DOWNLOAD_CHUNK_SIZE + 256 * 1024])
def test_truncated_download_is_retried(uploaded, hub_server, tmp_path, cut_at):
    """The client writes to disk in DOWNLOAD_CHUNK_SIZE (10 MiB) pieces and resumes from there."""
    hub_server.add_fault("truncate", method="GET", path="/model.dat", after_bytes=cut_at)
    path = hf_hub_download(REPO, "model.dat", endpoint=hub_server.url, token=WRITE_TOKEN,
                           cache_dir=tmp_path / "cache")  # fmt: skip
    assert Path(path).read_bytes() == (uploaded / "model.dat").read_bytes()
    gets = hub_server.request_log(method="GET", path="/resolve/")
    kept = cut_at // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    if kept == 0:  # nothing reached the disk: the retry starts over
        assert [(e["fault"], e["status"], e["range"]) for e in gets] == [("truncate", 200, None), (None, 200, None)]
    else:
        assert [(e["fault"], e["status"], e["range"]) for e in gets] == [
            ("truncate", 200, None), (None, 206, f"bytes={kept}-")
        ]  # fmt: skip


def test_xet_client_is_refused_loudly(hub_api, hub_server, tmp_path, monkeypatch):
    pytest.importorskip("hf_xet")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)  # as if HF_HUB_DISABLE_XET were unset
    hub_api.create_repo(REPO)
    big = tmp_path / "model.dat"
    big.write_bytes(_bytes(BIG_SIZE, 10))
    with pytest.raises(Exception, match="501"):
        hub_api.upload_file(path_or_fileobj=big, path_in_repo="model.dat", repo_id=REPO)
    assert _statuses(hub_server, "GET", "/xet-write-token/") == [501]
    assert hub_server.request_log(path=LFS_BATCH) == []  # no fallback to LFS in 2.4.0


# --------------------------------------------------------------------------------------------
# The server as a separate process, steered over HTTP
# --------------------------------------------------------------------------------------------


def test_a_wait_reads_a_repo_or_branch_not_there_yet_as_not_yet(tmp_path):
    """What a test polling the store from another process can meet: no repo yet, then a repo whose
    metadata is written but whose first commit (its `main`) is not (RepoStore.create writes both)."""
    store = RepoStore(tmp_path / "hub")

    def head():
        return store.files("models", "alice/new", "main")[1]

    assert not_yet(head) is False
    meta = {"private": True, "createdAt": "", "author": "alice", "refs": {}}
    store._write_json(store._repo_dir("models", "alice/new") / "meta.json", meta)
    with pytest.raises(HubError, match="Invalid rev id: main"):
        head()
    assert not_yet(head) is False
    store.delete("models", "alice/new")
    store.create("models", "alice/new", private=True, author="alice")
    assert set(not_yet(head)) == {".gitattributes"}
    with pytest.raises(HubError, match="Invalid path"):  # any other error still ends the wait
        not_yet(lambda: store.commit("models", "alice/new", "main", [("file", {"path": "../x"})], {}, "alice"))


def test_hub_fixtures_work_when_imported_first_in_a_fresh_process(hub_server, tmp_path):
    """huggingface_hub.utils is lazy: utils.tqdm need not be loaded when configure_client runs."""
    script = (
        "import sys, pytest\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import hub_fixtures\n"
        "assert 'huggingface_hub.utils.tqdm' not in sys.modules\n"
        "mp = pytest.MonkeyPatch()\n"
        f"hub_fixtures.configure_client(mp, {hub_server.url!r}, {str(tmp_path / 'hf_home')!r})\n"
        "from huggingface_hub import HfApi\n"
        "from huggingface_hub.utils import are_progress_bars_disabled\n"
        "assert are_progress_bars_disabled()\n"
        "print(HfApi(token=hub_fixtures.WRITE_TOKEN).whoami()['name'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alice"


def test_server_process_is_steered_over_http(hub_process, tmp_path, monkeypatch):
    configure_client(monkeypatch, hub_process.url, tmp_path / "hf_home")
    api = HfApi(endpoint=hub_process.url, token=WRITE_TOKEN)
    fault = hub_process.add_fault(status=500, path="/api/whoami-v2")
    with pytest.raises(HfHubHTTPError):
        api.whoami()  # whoami is not retried
    assert api.whoami()["name"] == "alice"
    assert [f["hits"] for f in hub_process.faults() if f["id"] == fault] == [1]
    assert [e["status"] for e in hub_process.request_log()] == [500, 200]

    hub_process.add_token("hf_bob_readonly", "bob", role="read")
    with pytest.raises(HfHubHTTPError) as excinfo:
        HfApi(endpoint=hub_process.url, token="hf_bob_readonly").create_repo("bob/model")
    assert excinfo.value.response.status_code == 403

    api.create_repo(REPO, private=True)
    api.upload_file(path_or_fileobj=b"ok\n", path_in_repo="ok.txt", repo_id=REPO)
    assert api.list_repo_files(REPO) == [".gitattributes", "ok.txt"]
    assert hub_process.stop() == 0
    assert WRITE_TOKEN not in hub_process.output()
