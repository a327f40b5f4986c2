#!/usr/bin/env python3
"""A local stand-in for the Hugging Face Hub HTTP API, for tests.

Standard library only, so it also runs inside a minimal container:

    python tests/hubserver.py --port 0 --root /tmp/hub [--port-file /tmp/hub.port] \
        [--token hf_xxx=alice:write] [--tokens-file tokens.json] [--verbose]

or from Python:

    server = HubServer(root, tokens={"hf_w": {"user": "alice", "role": "write"}}).start()
    api = HfApi(endpoint=server.url, token="hf_w")
    ...
    server.stop()

The protocol was taken from the real client (huggingface_hub 2.4.0, httpx2 transport); it is not a
full Hub, only what an upload/download client of model (and dataset) repos needs.

Endpoints
---------
  GET    /api/whoami-v2                                  user + auth.accessToken.role
  POST   /api/repos/create                               409 if the repo exists, 403 for read tokens
  DELETE /api/repos/delete
  GET    /api/{models|datasets}/{ns}/{name}[/revision/{rev}]   repo info (private, sha, siblings;
                                                         ?blobs=true adds size/blobId/lfs)
  PUT    /api/{type}/{ns}/{name}/settings                {"visibility": "private"|"public"} or {"private": bool}
  POST   /api/{type}/{ns}/{name}/preupload/{rev}         decides "regular" vs "lfs" per file
  POST   /api/{type}/{ns}/{name}/commit/{rev}            NDJSON: header, file, lfsFile, deletedFile, deletedFolder
  GET    /api/{type}/{ns}/{name}/tree/{rev}[/{path}]     ?recursive=&expand=, paginated with a Link header
  POST   /api/{type}/{ns}/{name}/paths-info/{rev}        form: paths=...&expand=
  GET    /api/{type}/{ns}/{name}/refs                    branches only ("main")
  GET    /api/{type}/{ns}/{name}/commits/{rev}           list_repo_commits
  GET    /api/{type}/{ns}/{name}/xet-{read,write}-token/ always 501: this server has no Xet storage
  GET    /api/agent-harnesses                            empty registry (see HF_ENDPOINT notes below)
  POST   /api/validate-yaml                              {"content", "repoType"}: checks a README.md's YAML
                                                         front matter (see "Model card metadata" below)
  POST   /[datasets/]{ns}/{name}.git/info/lfs/objects/batch   LFS batch API, "basic" transfer only
  PUT    /_lfs/upload/{ticket}                           the upload href handed out by the batch API
  POST   /_lfs/verify/{ticket}                           the verify href
  GET|HEAD /[datasets/]{ns}/{name}/resolve/{rev}/{path}  ETag, X-Repo-Commit, X-Linked-Etag/-Size (LFS),
                                                         Content-Length, Accept-Ranges, Range -> 206

Test control (never faulted, never in the request log):
  GET    /_test/health
  GET    /_test/log            {"requests": [{"method", "path", "status", "fault", "user", ...}]}
  DELETE /_test/log
  GET    /_test/faults         {"faults": [{..., "hits": n}]}
  POST   /_test/faults         one fault object, or {"faults": [...]}  -> {"ids": [...]}
  DELETE /_test/faults
  POST   /_test/tokens         {"token", "user", "role", "orgs"}  (add a token at runtime)
  POST   /_test/reset          clear faults and log

Faults (``HubServer.add_fault(kind, **fields)`` or ``POST /_test/faults``), matched against the
request method and a substring of the URL path, each used ``count`` times (None = forever) and
counted in ``hits``:
  status    answer ``status`` (default 500) instead of handling the request; a 429 carries
            ``Retry-After: retry_after`` (default 1).
  stall     sleep ``seconds`` before handling the request normally.
  drop      read ``after_bytes`` of the request body, then reset the connection without answering
            (a connection dropped mid-upload).
  truncate  handle the request, but reset the connection after ``after_bytes`` of the response body.
Read-only tokens are plain configuration: ``role: "read"`` gets 403 on create/preupload/LFS/commit.
Tokens are never logged; the log holds the user name.

What the real client (huggingface_hub 2.4.0) retries by itself (``http_backoff``: 408/429/500/502/
503/504 and network errors, 5 retries, 1s, 2s, 4s... backoff; a 429 waits ``Retry-After`` + 1 s):
  retried:     preupload POST, LFS batch POST, LFS PUT (also on a dropped connection), LFS verify,
               tree/commits listing GETs (pagination), file download GET (only 408/429 and dropped
               connections; it resumes with a Range header from the last full 10 MiB
               DOWNLOAD_CHUNK_SIZE written, so a cut in the first 10 MiB restarts from 0); the
               HEAD on /resolve is retried by hf_hub_download with backoff after a first failed
               attempt, if the file is not already cached.
  not retried: whoami, create_repo, repo_info (so snapshot_download fails on a 5xx there, with
               LocalEntryNotFoundError when nothing is cached), settings, paths-info, validate-yaml
               and the commit POST (a 5xx or a dropped connection there surfaces as an exception to
               the caller).

Model card metadata (``POST /api/validate-yaml``)
-------------------------------------------------
``create_commit`` (and ``upload_folder``) call ``HfApi._validate_yaml`` whenever a commit adds the
top-level ``README.md``, before anything is uploaded; ``RepoCard.validate`` /
``RepoCard.push_to_hub`` call the same route (anonymously, with ``Accept: text/plain``). The request
is ``{"content": <README.md text>, "repoType": "model"|"dataset"|"space"}``. The answer:
  200  {"errors": [], "warnings": [{"message"}...]}   the client ``warnings.warn``s each warning
       (a card with no or empty front matter gets an "empty or missing yaml metadata" one, as on
       the Hub);
  400  {"error", "errors": [{"message"}...], "warnings": [...]}   ``_validate_yaml`` turns this into
       ``ValueError("Invalid metadata in README.md.\\n- <message>...")`` and the commit never starts;
       with ``Accept: text/plain`` the body is the messages as text (``RepoCard.validate`` raises
       ``ValueError(response.text)``).
The front matter is found as the client finds it (``repocard.REGEX_YAML_BLOCK``) and parsed with
PyYAML's ``safe_load`` (what the client itself uses; imported on first use, so the server still
starts without it, and then accepts any front matter with a warning that it was not checked).
Besides YAML syntax it checks a few types the Hub's card schema fixes (metadata is a mapping,
``model-index`` a list, ``license``/``library_name``/``pipeline_tag`` strings, ``tags``/``datasets``/
``language``/``metrics``/``base_model`` a string or a list of strings); it is not the Hub's full
schema (no license list, no check that ``base_model`` exists).

Findings about the client configuration
---------------------------------------
* Xet: with ``hf_xet`` installed (it is, hf-xet 1.8.0), 2.4.0 uploads *only* through Xet: both
  ``create_commit`` (``_upload_files``) and ``upload_folder`` (``pipelined_upload``) take the Xet
  path whenever ``is_xet_available()``; there is no server-side negotiation and no fallback to LFS.
  The only switch is ``HF_HUB_DISABLE_XET=1`` (read into ``constants.HF_HUB_DISABLE_XET`` at import;
  ``is_xet_available()`` reads the constant at call time, so patching the constant also works).
  With it set, uploads use the preupload + LFS batch + basic PUT protocol served here. This server
  answers the Xet token routes with 501 so a client left on Xet fails loudly. Downloads only use
  Xet when the HEAD response carries ``X-Xet-Hash``, which this server never sends.
* HF_ENDPOINT: ``HfApi(endpoint=...)``, ``hf_hub_download(endpoint=...)`` and
  ``snapshot_download(endpoint=...)`` are enough for every Hub call they make, but several things
  are fixed at import time from the environment: ``constants.ENDPOINT`` (used by the module-level
  helpers such as ``huggingface_hub.upload_folder`` through the default ``HfApi()`` instance, by
  ``HUGGINGFACE_CO_URL_TEMPLATE``, telemetry and the agent-harness registry fetch), HF_HOME/cache
  paths, ``HF_HUB_DISABLE_XET``, ``HF_HUB_ETAG_TIMEOUT`` and ``HF_HUB_DISABLE_TELEMETRY``. Without
  ``HF_HUB_DISABLE_TELEMETRY=1`` the first request of a process builds a user agent that fetches
  ``{constants.ENDPOINT}/api/agent-harnesses`` (i.e. https://huggingface.co unless HF_ENDPOINT was
  set before import). So: code under test that uses the module-level functions or ``HfApi()``
  without ``endpoint=`` must get HF_ENDPOINT (and the other variables) in its environment before
  it imports huggingface_hub, e.g. run it in a subprocess; in-process tests pass ``endpoint=`` and
  patch the constants (see tests/hub_fixtures.py).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import fnmatch
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

WRITE_TOKEN = "hf_writetoken_alice_0123456789abcdef"
READ_TOKEN = "hf_readtoken_alice_0123456789abcdef"
DEFAULT_TOKENS = {
    WRITE_TOKEN: {"user": "alice", "role": "write"},
    READ_TOKEN: {"user": "alice", "role": "read"},
}

# The Hub stores files larger than 10 MB with LFS (and refuses them as regular git blobs).
LFS_THRESHOLD = 10 * 1024 * 1024
REPO_TYPES = {"model": "models", "dataset": "datasets"}  # API singular -> URL plural
URL_PREFIX = {"models": "", "datasets": "datasets/"}  # prefix of /resolve and .git URLs

# The .gitattributes the Hub puts in every new repo (abridged): these files always go through LFS.
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack"
        " *.npy *.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors"
        " saved_model/**/* *.tar.* *.tar *.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents*"
    ).split()
)

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"
CHUNK = 1024 * 1024


class HubError(Exception):
    """An error answered to the client: JSON {"error": message} plus the Hub's X-Error-* headers."""

    def __init__(self, status: int, message: str, code: str | None = None, headers=None, extra=None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def git_blob_oid(data: bytes) -> str:
    """The git object id of a blob (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _clean_repo_path(path) -> str:
    """Validate a path inside a repo; the Hub refuses absolute paths, '..' and .git/."""
    if not isinstance(path, str) or not path.strip("/"):
        raise HubError(400, f"Invalid path: {path!r}")
    parts = path.strip("/").split("/")
    if any(part in ("", ".", "..", ".git") for part in parts):
        raise HubError(400, f"Invalid path: {path!r}")
    return "/".join(parts)


def _lfs_patterns(gitattributes: str) -> list[str]:
    """The patterns of a .gitattributes file that have `filter=lfs`."""
    patterns = []
    for line in gitattributes.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and "filter=lfs" in fields[1:]:
            patterns.append(fields[0])
    return patterns


def _matches_any(path: str, patterns: list[str]) -> bool:
    """Approximate gitattributes matching: a pattern without '/' matches the basename anywhere."""
    basename = path.rsplit("/", 1)[-1]
    for pattern in patterns:
        if "/" in pattern.strip("/"):
            if fnmatch.fnmatchcase(path, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(basename, pattern):
            return True
    return False


def _header_value(text: str) -> str:
    """`text` as one line of ASCII: safe in an HTTP header (a newline would end the header)."""
    return " ".join(str(text).split()).encode("ascii", "replace").decode()


# --------------------------------------------------------------------------------------------
# Model card metadata (POST /api/validate-yaml)
# --------------------------------------------------------------------------------------------

# The client's own pattern for a card's front matter (huggingface_hub.repocard.REGEX_YAML_BLOCK).
YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
CARD_DOCS = {"model": "model-cards", "dataset": "datasets-cards", "space": "spaces-config-reference"}
# Fields of the Hub's card metadata schema whose type this server checks.
STRING_FIELDS = ("license", "library_name", "pipeline_tag")
STRINGS_FIELDS = ("tags", "datasets", "language", "metrics", "base_model")  # a string or a list of them
LIST_FIELDS = ("model-index",)


def validate_card_metadata(content: str, repo_type: str = "model") -> tuple[list[str], list[str]]:
    """(errors, warnings) for a README.md's YAML front matter, as /api/validate-yaml reports them."""
    match = YAML_BLOCK.search(content)
    missing = f"empty or missing yaml metadata in repo card (https://huggingface.co/docs/hub/{CARD_DOCS[repo_type]})"
    if match is None or not match.group(2).strip():
        return [], [missing]
    try:
        import yaml  # PyYAML: what huggingface_hub parses cards with; imported here to keep the server stdlib-only
    except ImportError:
        return [], ["hubserver: PyYAML is not installed, so the metadata was not checked"]
    try:
        data = yaml.safe_load(match.group(2))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if mark is None:
            return [f"Invalid YAML in the metadata: {err}"], []
        line = content[: match.end(1)].count("\n") + mark.line + 1  # a line number of README.md
        problem = " ".join(x for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x)
        return [f"Invalid YAML in the metadata, line {line} column {mark.column + 1}: {problem or err}"], []
    if data is None:
        return [], [missing]
    if not isinstance(data, dict):
        return [f"The metadata must be a YAML mapping (key: value), not a {type(data).__name__}"], []
    errors = []
    for key in STRING_FIELDS:
        if key in data and not isinstance(data[key], str):
            errors.append(f'"{key}" must be a string')
    for key in STRINGS_FIELDS:
        value = data.get(key)
        if key in data and not (isinstance(value, str)
                                or isinstance(value, list) and all(isinstance(v, str) for v in value)):
            errors.append(f'"{key}" must be a string or an array of strings')
    for key in LIST_FIELDS:
        if key in data and not isinstance(data[key], list):
            errors.append(f'"{key}" must be an array')
    return errors, []


# --------------------------------------------------------------------------------------------
# Storage
# --------------------------------------------------------------------------------------------


class RepoStore:
    """Repos, commits and file contents on disk under `root`.

    Layout:
      objects/<sha256[:2]>/<sha256>                   file contents (regular and LFS), by sha256
      repos/<models|datasets>/<ns>/<name>/meta.json   {"private", "createdAt", "author", "refs"}
      repos/<...>/commits/<sha>.json                  {"id", "parents", "files", "title", ...}
      tmp/                                            LFS uploads in progress
    A commit's "files" maps path -> {"sha256", "size", "lfs", "oid", "pointerSize"}, where "oid"
    is the git blob id the Hub reports (of the content, or of the LFS pointer for LFS files).
    Commits are immutable, so old revisions stay downloadable by commit sha.
    """

    def __init__(self, root):
        self.root = Path(root)
        for sub in ("objects", "repos", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()  # serialises repo metadata and ref updates

    # -- blobs -------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256[:2] / sha256

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        path = self.blob_path(sha256)
        return path.is_file() and (size is None or path.stat().st_size == size)

    def put_blob(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        if not self.has_blob(sha256, len(data)):
            tmp = self.new_tmp_path()
            tmp.write_bytes(data)
            self.adopt_blob(tmp, sha256)
        return sha256

    def new_tmp_path(self) -> Path:
        return self.root / "tmp" / secrets.token_hex(8)

    def adopt_blob(self, tmp: Path, sha256: str) -> None:
        """Move a fully written and verified temp file into the object store (atomic rename)."""
        target = self.blob_path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, target)

    # -- repos -------------------------------------------------------------------------------

    def _repo_dir(self, rtype: str, repo_id: str) -> Path:
        # repo ids come from URLs: never let one walk out of the root (e.g. "../..")
        if not REPO_ID.fullmatch(repo_id) or ".." in repo_id:
            raise HubError(404, f"Repository Not Found: {repo_id}", "RepoNotFound")
        return self.root / "repos" / rtype / repo_id

    @staticmethod
    def _write_json(path: Path, obj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(obj, indent=1))
        os.replace(tmp, path)

    def exists(self, rtype: str, repo_id: str) -> bool:
        return (self._repo_dir(rtype, repo_id) / "meta.json").is_file()

    def meta(self, rtype: str, repo_id: str) -> dict:
        path = self._repo_dir(rtype, repo_id) / "meta.json"
        with self.lock:
            if not path.is_file():
                raise HubError(404, f"Repository Not Found: {repo_id}", "RepoNotFound")
            return json.loads(path.read_text())

    def create(self, rtype: str, repo_id: str, private: bool, author: str) -> None:
        """Create a repo whose first commit holds the Hub's default .gitattributes."""
        with self.lock:
            meta = {"private": private, "createdAt": _now_iso(), "author": author, "refs": {}}
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)
            blob = DEFAULT_GITATTRIBUTES.encode()
            files = {".gitattributes": _regular_entry(self.put_blob(blob), blob)}
            sha = self._write_commit(rtype, repo_id, None, files, "initial commit", "", author)
            meta["refs"]["main"] = sha
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)

    def delete(self, rtype: str, repo_id: str) -> None:
        import shutil

        with self.lock:
            self.meta(rtype, repo_id)  # 404 if missing
            shutil.rmtree(self._repo_dir(rtype, repo_id))

    def update_meta(self, rtype: str, repo_id: str, **changes) -> dict:
        with self.lock:
            meta = self.meta(rtype, repo_id)
            meta.update(changes)
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)
            return meta

    # -- commits -----------------------------------------------------------------------------

    def resolve(self, rtype: str, repo_id: str, rev: str) -> str:
        """Branch name, full commit sha or unique sha prefix (>= 7 chars) -> commit sha."""
        meta = self.meta(rtype, repo_id)
        if rev in meta["refs"]:
            return meta["refs"][rev]
        commits_dir = self._repo_dir(rtype, repo_id) / "commits"
        if re.fullmatch(r"[0-9a-f]{7,40}", rev):
            found = [p.stem for p in commits_dir.glob(f"{rev}*.json")]
            if len(found) == 1:
                return found[0]
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def commit_data(self, rtype: str, repo_id: str, sha: str) -> dict:
        return json.loads((self._repo_dir(rtype, repo_id) / "commits" / f"{sha}.json").read_text())

    def files(self, rtype: str, repo_id: str, rev: str) -> tuple[str, dict]:
        sha = self.resolve(rtype, repo_id, rev)
        return sha, self.commit_data(rtype, repo_id, sha)["files"]

    def history(self, rtype: str, repo_id: str, sha: str):
        """Commits from `sha` back to the first one (the history is linear)."""
        while sha:
            commit = self.commit_data(rtype, repo_id, sha)
            yield commit
            sha = commit["parents"][0] if commit["parents"] else None

    def _write_commit(self, rtype, repo_id, parent, files, title, message, author) -> str:
        date = _now_iso()
        seed = json.dumps([parent, files, title, message, date, secrets.token_hex(4)], sort_keys=True)
        sha = hashlib.sha1(seed.encode()).hexdigest()
        commit = {
            "id": sha, "parents": [parent] if parent else [], "files": files,
            "title": title, "message": message, "author": author, "date": date,
        }  # fmt: skip
        self._write_json(self._repo_dir(rtype, repo_id) / "commits" / f"{sha}.json", commit)
        return sha

    def commit(self, rtype, repo_id, branch, operations, header, author) -> str:
        """Apply `operations` on top of `branch` and move the branch; all or nothing."""
        with self.lock:
            meta = self.meta(rtype, repo_id)
            if branch not in meta["refs"]:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = meta["refs"][branch]
            parent_commit = header.get("parentCommit")
            if parent_commit and not head.startswith(parent_commit):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = apply_operations(self, self.commit_data(rtype, repo_id, head)["files"], operations)
            title = header.get("summary") or "Commit"
            sha = self._write_commit(rtype, repo_id, head, files, title, header.get("description") or "", author)
            meta["refs"][branch] = sha
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)
            return sha

    def read_file(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> bytes:
        """Convenience for tests: the content of `path` at `revision`."""
        _, files = self.files(REPO_TYPES[repo_type], repo_id, revision)
        return self.blob_path(files[path]["sha256"]).read_bytes()


def _regular_entry(sha256: str, data: bytes) -> dict:
    return {"sha256": sha256, "size": len(data), "lfs": False, "oid": git_blob_oid(data)}


def _lfs_entry(sha256: str, size: int) -> dict:
    pointer = LFS_POINTER.format(oid=sha256, size=size).encode()
    return {"sha256": sha256, "size": size, "lfs": True, "oid": git_blob_oid(pointer), "pointerSize": len(pointer)}


def apply_operations(store: RepoStore, files: dict, operations: list[tuple[str, dict]]) -> dict:
    """The file map after applying the commit's NDJSON operations, in order."""
    files = dict(files)
    for key, value in operations:
        path = _clean_repo_path(value.get("path"))
        if key == "file":
            if value.get("encoding", "base64") != "base64":
                raise HubError(400, f"Unsupported encoding for {path}")
            data = base64.b64decode(value.get("content", ""))
            files[path] = _regular_entry(store.put_blob(data), data)
        elif key == "lfsFile":
            oid = value.get("oid", "")
            if value.get("algo", "sha256") != "sha256" or not store.has_blob(oid):
                raise HubError(400, f"LFS object {oid} for {path} was never uploaded")
            files[path] = _lfs_entry(oid, store.blob_path(oid).stat().st_size)
        elif key == "deletedFile":
            if path not in files:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            del files[path]
        elif key == "deletedFolder":
            doomed = [p for p in files if p.startswith(path + "/")]
            if not doomed:
                raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
            for p in doomed:
                del files[p]
        else:
            raise HubError(400, f"Unknown commit operation: {key!r}")
    return files


# --------------------------------------------------------------------------------------------
# Tree listings
# --------------------------------------------------------------------------------------------


def _file_item(path: str, entry: dict) -> dict:
    item = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
    if entry["lfs"]:
        item["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": entry["pointerSize"]}
    return item


def _dir_signature(files: dict, path: str):
    """What identifies the content of a file or folder (None if absent), to find last commits."""
    if path in files:
        return files[path]["oid"]
    under = sorted((p, e["oid"]) for p, e in files.items() if p.startswith(path + "/"))
    return hashlib.sha1(json.dumps(under).encode()).hexdigest() if under else None


def _dir_item(path: str, files: dict) -> dict:
    return {"type": "directory", "oid": _dir_signature(files, path), "size": 0, "path": path}


def tree_items(files: dict, path: str, recursive: bool) -> list[dict]:
    """The items under `path` (folders first, like the Hub); 404 if `path` is not a folder."""
    prefix = f"{path}/" if path else ""
    if path and not any(p.startswith(prefix) for p in files):
        raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
    dirs, leafs = set(), []
    for p in sorted(files):
        if not p.startswith(prefix):
            continue
        parts = p[len(prefix) :].split("/")
        if recursive:
            dirs.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts)))
            leafs.append(p)
        elif len(parts) == 1:
            leafs.append(p)
        else:
            dirs.add(prefix + parts[0])
    return [_dir_item(d, files) for d in sorted(dirs)] + [_file_item(p, files[p]) for p in leafs]


def add_last_commits(store: RepoStore, rtype: str, repo_id: str, sha: str, items: list[dict]) -> None:
    """`expand=true`: attach the last commit that changed each item (walks the history)."""
    pending = {item["path"]: item for item in items}
    for commit in store.history(rtype, repo_id, sha):
        if not pending:
            break
        parent = commit["parents"][0] if commit["parents"] else None
        parent_files = store.commit_data(rtype, repo_id, parent)["files"] if parent else {}
        for path in list(pending):
            if _dir_signature(commit["files"], path) != _dir_signature(parent_files, path):
                info = {"id": commit["id"], "title": commit["title"], "date": commit["date"]}
                pending.pop(path)["lastCommit"] = info


# --------------------------------------------------------------------------------------------
# Faults and request log
# --------------------------------------------------------------------------------------------

FAULT_KINDS = ("status", "stall", "drop", "truncate")


@dataclasses.dataclass
class Fault:
    kind: str = "status"
    count: int | None = 1  # how many matching requests it hits; None = all of them
    method: str | None = None  # e.g. "PUT"; None = any
    path: str | None = None  # substring of the URL path; None = any
    status: int = 500  # kind=status
    retry_after: int | None = None  # kind=status: Retry-After header (a 429 defaults to 1)
    seconds: float = 0.0  # kind=stall
    after_bytes: int = 0  # kind=drop (request body) / truncate (response body)
    id: int = 0
    hits: int = 0

    @classmethod
    def from_dict(cls, spec: dict) -> Fault:
        names = {f.name for f in dataclasses.fields(cls)} - {"id", "hits"}
        unknown = set(spec) - names
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        fault = cls(**spec)
        if fault.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {fault.kind!r}; expected one of {FAULT_KINDS}")
        if fault.kind == "status" and fault.status == 429 and fault.retry_after is None:
            fault.retry_after = 1
        return fault

    def matches(self, method: str, path: str) -> bool:
        if self.count is not None and self.hits >= self.count:
            return False
        if self.method and self.method.upper() != method:
            return False
        return not self.path or self.path in path


class FaultInjector:
    """Thread-safe list of faults; the first matching, unexhausted fault wins."""

    def __init__(self):
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._next_id = 1

    def add(self, spec: dict) -> int:
        fault = Fault.from_dict(spec)
        with self._lock:
            fault.id, self._next_id = self._next_id, self._next_id + 1
            self._faults.append(fault)
        return fault.id

    def take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return dataclasses.replace(fault)
        return None

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [dataclasses.asdict(f) for f in self._faults]


@dataclasses.dataclass
class Principal:
    user: str
    role: str = "write"  # "read" or "write"
    orgs: tuple = ()

    @property
    def namespaces(self) -> set:
        return {self.user, *self.orgs}

    def can_read(self, namespace: str) -> bool:
        return namespace in self.namespaces

    def can_write(self, namespace: str) -> bool:
        return self.role == "write" and namespace in self.namespaces


# --------------------------------------------------------------------------------------------
# HTTP handler
# --------------------------------------------------------------------------------------------

REPO = r"/api/(?P<rtype>models|datasets)/(?P<repo_id>[^/]+/[^/]+)"
GIT_REPO = r"/(?:(?P<prefix>datasets)/)?(?P<repo_id>[^/]+/[^/]+?)"
ROUTES = [
    ("GET", r"/api/whoami-v2", "whoami"),
    ("GET", r"/api/agent-harnesses", "agent_harnesses"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("POST", r"/api/repos/create", "create_repo"),
    ("DELETE", r"/api/repos/delete", "delete_repo"),
    ("GET", REPO + r"(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
    ("PUT", REPO + r"/settings", "settings"),
    ("POST", REPO + r"/preupload/(?P<rev>[^/]+)", "preupload"),
    ("POST", REPO + r"/commit/(?P<rev>[^/]+)", "commit"),
    ("GET", REPO + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree"),
    ("POST", REPO + r"/paths-info/(?P<rev>[^/]+)", "paths_info"),
    ("GET", REPO + r"/refs", "refs"),
    ("GET", REPO + r"/commits/(?P<rev>[^/]+)", "commits"),
    ("GET", REPO + r"/xet-(?:read|write)-token/.*", "xet_token"),
    ("POST", GIT_REPO + r"\.git/info/lfs/objects/batch", "lfs_batch"),
    ("PUT", r"/_lfs/upload/(?P<ticket>[0-9a-f]+)", "lfs_put"),
    ("POST", r"/_lfs/verify/(?P<ticket>[0-9a-f]+)", "lfs_verify"),
    ("GET", GIT_REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    ("HEAD", GIT_REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
]
ROUTES = [(method, re.compile(pattern + "$"), name) for method, pattern, name in ROUTES]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real Hub; every answer has a Content-Length
    server_version = "hubserver/1.0"
    timeout = 120  # idle keep-alive connections end eventually

    @property
    def hub(self) -> HubServer:
        return self.server.hub

    def do_GET(self):
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, format, *args):  # noqa: A002 (the base class's signature)
        pass  # the request log replaces http.server's stderr lines

    # -- request lifecycle -------------------------------------------------------------------

    def _handle(self) -> None:
        url = urlsplit(self.path)
        self.route_path, self.query = url.path, parse_qs(url.query)
        self._status = self._fault = self._truncate_at = self._user = None
        self._body, self._body_done = None, False
        self._entry = None
        if self.route_path.startswith("/_test/"):
            return self._guarded(self._test_api)  # control plane: never faulted nor logged
        self._entry = self.hub._open_entry(self)
        try:
            self._guarded(self._serve)
        finally:
            self._log_outcome()

    def _log_outcome(self) -> None:
        """Complete the log entry once, *before* the client can see the outcome (tests never race)."""
        if self._entry is not None:
            self.hub._close_entry(self._entry, self._status, self._user)
            self._entry = None

    def _guarded(self, fn) -> None:
        try:
            fn()
        except HubError as err:
            self._send_error(err)
        except (ConnectionError, TimeoutError):  # socket.timeout is TimeoutError
            self.close_connection = True  # the client went away; nothing to answer
        except Exception as err:  # a bug in this server: answer 500 and say where
            traceback.print_exc()
            self._send_error(HubError(500, f"hubserver internal error: {err!r}"))

    def _serve(self) -> None:
        fault = self.hub.faults.take(self.command, self.route_path)
        if fault is not None:
            self._fault = fault
            self._entry.update(fault=fault.kind, fault_id=fault.id)
            if self._apply_fault(fault):
                return
        self._dispatch()

    def _apply_fault(self, fault: Fault) -> bool:
        """Act out a fault; True if that answered (or killed) the request."""
        if fault.kind == "stall":
            self.hub._stopping.wait(fault.seconds)
            return False
        if fault.kind == "truncate":
            self._truncate_at = fault.after_bytes
            return False
        if fault.kind == "drop":
            self._drop(fault.after_bytes)
            return True
        headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
        self._send_error(HubError(fault.status, f"Injected fault #{fault.id}", headers=headers))
        return True

    def _dispatch(self) -> None:
        for method, pattern, name in ROUTES:
            if method == self.command and (match := pattern.match(self.route_path)):
                return getattr(self, "h_" + name)(match.groupdict())
        raise HubError(404, f"Not Found: {self.command} {self.route_path}")

    # -- request bodies ----------------------------------------------------------------------

    def _iter_body(self):
        """Yield the request body in pieces (Content-Length or chunked), marking it consumed."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            yield from self._iter_chunked()
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining > 0:
                data = self.rfile.read(min(CHUNK, remaining))
                if not data:
                    raise ConnectionError("client closed the connection mid-body")
                remaining -= len(data)
                yield data
        self._body_done = True

    def _iter_chunked(self):
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            data = self.rfile.read(size)
            if len(data) < size:
                raise ConnectionError("client closed the connection mid-body")
            self.rfile.readline()
            yield data

    def _read_body(self) -> bytes:
        if self._body is None:
            self._body = b"" if self._body_done else b"".join(self._iter_body())
        return self._body

    def _json_body(self) -> dict:
        try:
            body = json.loads(self._read_body() or b"{}")
        except ValueError:
            raise HubError(400, "Request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HubError(400, "Request body must be a JSON object")
        return body

    def _discard_body(self) -> None:
        """Keep the keep-alive connection usable: drain a small unread body, or close."""
        if self._body_done:
            return
        if int(self.headers.get("Content-Length") or 0) > 4 * CHUNK:
            self.close_connection = True
            return
        try:
            self._read_body()
        except (ConnectionError, ValueError):
            self.close_connection = True

    # -- responses ---------------------------------------------------------------------------

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def _start(self, status: int, headers: dict, length: int, content_type: str) -> None:
        self._discard_body()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("X-Request-Id", self.headers.get("X-Amzn-Trace-Id") or secrets.token_hex(8))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self._log_outcome()
        self.end_headers()  # flushes the status line and headers to the client

    def _send(self, status: int, body: bytes = b"", headers=None, content_type="application/json") -> None:
        self._start(status, headers or {}, len(body), content_type)
        if self.command != "HEAD":
            self._write(body)

    def _json(self, obj, status: int = 200, headers=None, content_type="application/json") -> None:
        self._send(status, json.dumps(obj).encode(), headers, content_type)

    def _send_error(self, err: HubError) -> None:
        headers = dict(err.headers)
        headers["X-Error-Message"] = _header_value(err.message)
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json({"error": err.message, **err.extra}, err.status, headers)

    def _write(self, data: bytes) -> None:
        """Write response body bytes, honouring a `truncate` fault."""
        if self._truncate_at is not None:
            keep = max(0, self._truncate_at)
            self.wfile.write(data[:keep])
            self._truncate_at = keep - min(keep, len(data))
            if len(data) > keep:
                self.wfile.flush()
                self._abort_connection(reset=False)  # FIN: the client gets the bytes sent so far
                raise ConnectionError("truncated by fault")
            return
        self.wfile.write(data)

    def _drop(self, after_bytes: int) -> None:
        """Read up to `after_bytes` of the body, then reset the connection without answering."""
        seen = 0
        try:
            for piece in self._iter_body():
                seen += len(piece)
                if seen >= after_bytes:
                    break
        except ConnectionError:
            pass
        self._abort_connection()

    def _abort_connection(self, reset: bool = True) -> None:
        """End the connection without (completing) an answer; `reset` sends a RST, like a crash."""
        self._log_outcome()
        self.close_connection = True
        try:
            if reset:  # linger 0 turns close() into a RST instead of a polite FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{self.headers.get('Host') or f'{host}:{port}'}"

    # -- auth ----------------------------------------------------------------------------------

    def _principal(self) -> Principal | None:
        """The token's owner, None when anonymous; 401 for an unknown token (as the Hub does)."""
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        principal = self.hub._tokens.get(token)
        if principal is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        self._user = principal.user
        return principal

    def _require_principal(self) -> Principal:
        principal = self._principal()
        if principal is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return principal

    def _readable(self, rtype: str, repo_id: str) -> tuple[Principal | None, dict]:
        """The repo's metadata; 404 (not 403) for private repos of others, like the Hub."""
        principal = self._principal()
        meta = self.hub.store.meta(rtype, repo_id)
        namespace = repo_id.split("/")[0]
        if meta["private"] and not (principal and principal.can_read(namespace)):
            raise HubError(404, f"Repository Not Found: {repo_id}", "RepoNotFound")
        return principal, meta

    def _writable(self, rtype: str, repo_id: str) -> tuple[Principal, dict]:
        principal, meta = self._readable(rtype, repo_id)
        if principal is None or not principal.can_write(repo_id.split("/")[0]):
            raise HubError(403, f"You don't have the rights to write to {repo_id}: use a write token")
        return principal, meta

    # -- API: account and repos ------------------------------------------------------------------

    def h_whoami(self, m) -> None:
        p = self._require_principal()
        self._json({
            "type": "user", "id": hashlib.sha1(p.user.encode()).hexdigest()[:24], "name": p.user,
            "fullname": p.user, "email": f"{p.user}@example.invalid", "emailVerified": True,
            "canPay": False, "isPro": False, "periodEnd": None, "avatarUrl": "",
            "orgs": [{"type": "org", "name": o, "fullname": o, "roleInOrg": p.role} for o in p.orgs],
            "auth": {"type": "access_token",
                     "accessToken": {"displayName": "hubserver", "role": p.role, "createdAt": _now_iso()}},
        })  # fmt: skip

    def h_agent_harnesses(self, m) -> None:
        self._json({"standardEnvVars": [], "harnesses": {}})

    def h_validate_yaml(self, m) -> None:
        body = self._json_body()
        self._principal()  # anonymous is fine (RepoCard.validate sends no token); a bad token is 401
        content, repo_type = body.get("content"), body.get("repoType") or "model"
        if not isinstance(content, str):
            raise HubError(400, '"content" must be a string')
        if repo_type not in ("model", "dataset", "space"):
            raise HubError(400, f'"repoType" must be one of [model, dataset, space], got {repo_type!r}')
        errors, warnings = validate_card_metadata(content, repo_type)
        as_text = "text/plain" in self.headers.get("Accept", "")
        if not errors:
            if as_text:
                return self._send(200, b"", content_type="text/plain; charset=utf-8")
            return self._json({"errors": [], "warnings": [{"message": w} for w in warnings]})
        summary = "Invalid metadata in README.md: " + "; ".join(errors)
        if as_text:
            text = "\n".join(errors).encode()
            return self._send(400, text, {"X-Error-Message": _header_value(summary)}, "text/plain; charset=utf-8")
        raise HubError(400, summary, extra={"errors": [{"message": e} for e in errors],
                                            "warnings": [{"message": w} for w in warnings]})

    def h_create_repo(self, m) -> None:
        body = self._json_body()
        p = self._require_principal()
        rtype = REPO_TYPES.get(body.get("type") or "model")
        if rtype is None:
            raise HubError(400, f"Unsupported repo type: {body.get('type')}")
        namespace, name = body.get("organization") or p.user, body.get("name") or ""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", name):
            raise HubError(400, f"Invalid repo name: {name!r}")
        repo_id = f"{namespace}/{name}"
        if not p.can_write(namespace):
            raise HubError(403, f'You don\'t have the rights to create a repo under the namespace "{namespace}"')
        url = f"{self._base_url()}/{URL_PREFIX[rtype]}{repo_id}"
        with self.hub.store.lock:
            if self.hub.store.exists(rtype, repo_id):
                raise HubError(409, "You already created this repo", extra={"url": url})
            private = body.get("visibility") == "private" or body.get("private") is True
            self.hub.store.create(rtype, repo_id, private, p.user)
        self._json({"url": url, "name": repo_id, "id": repo_id})

    def h_delete_repo(self, m) -> None:
        body = self._json_body()
        p = self._require_principal()
        rtype = REPO_TYPES.get(body.get("type") or "model", "models")
        repo_id = f"{body.get('organization') or p.user}/{body.get('name')}"
        self._writable(rtype, repo_id)
        self.hub.store.delete(rtype, repo_id)
        self._json({})

    def h_repo_info(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        _, meta = self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"] or "main"))
        commit = self.hub.store.commit_data(rtype, repo_id, sha)
        blobs = _truthy(self.query.get("blobs", ["false"])[0])
        siblings = []
        for path in sorted(files):
            sibling = {"rfilename": path}
            if blobs:
                entry = files[path]
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if entry["lfs"]:
                    sibling["lfs"] = {"size": entry["size"], "sha256": entry["sha256"],
                                      "pointerSize": entry["pointerSize"]}  # fmt: skip
            siblings.append(sibling)
        self._json({
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": repo_id.split("/")[0], "sha": sha, "lastModified": commit["date"],
            "createdAt": meta["createdAt"], "private": meta["private"], "gated": meta.get("gated", False),
            "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "usedStorage": sum(e["size"] for e in files.values()),
        })  # fmt: skip

    def h_settings(self, m) -> None:
        body = self._json_body()
        self._writable(m["rtype"], m["repo_id"])
        changes = {}
        if "visibility" in body:
            if body["visibility"] not in ("public", "private"):
                raise HubError(400, f"Unsupported visibility: {body['visibility']!r}")
            changes["private"] = body["visibility"] == "private"
        if "private" in body:
            changes["private"] = bool(body["private"])
        if "gated" in body:
            changes["gated"] = body["gated"]
        meta = self.hub.store.update_meta(m["rtype"], m["repo_id"], **changes)
        self._json({"private": meta["private"], "gated": meta.get("gated", False)})

    def h_refs(self, m) -> None:
        _, meta = self._readable(m["rtype"], m["repo_id"])
        branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha} for b, sha in meta["refs"].items()]
        self._json({"branches": branches, "converts": [], "tags": [], "pullRequests": []})

    def h_commits(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        self._readable(rtype, repo_id)
        sha = self.hub.store.resolve(rtype, repo_id, unquote(m["rev"]))
        items = [
            {"id": c["id"], "title": c["title"], "message": c["message"],
             "authors": [{"user": c["author"]}], "date": c["date"]}
            for c in self.hub.store.history(rtype, repo_id, sha)
        ]  # fmt: skip
        self._paginated(items)

    def h_xet_token(self, m) -> None:
        raise HubError(
            501, "This local hub has no Xet storage: set HF_HUB_DISABLE_XET=1 so the client uses LFS.",
        )

    # -- API: uploads --------------------------------------------------------------------------

    def h_preupload(self, m) -> None:
        """Tell the client which files go as base64 in the commit and which through LFS."""
        rtype, repo_id = m["rtype"], m["repo_id"]
        body = self._json_body()
        self._writable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        gitattributes = files.get(".gitattributes")
        patterns = _lfs_patterns(
            self.hub.store.blob_path(gitattributes["sha256"]).read_text() if gitattributes else ""
        )
        answers = []
        for item in body.get("files") or []:
            path = _clean_repo_path(item.get("path"))
            sample = base64.b64decode(item.get("sample") or "")
            lfs = (
                int(item.get("size") or 0) > self.hub.lfs_threshold
                or _matches_any(path, patterns)
                or b"\0" in sample  # binary content is never stored as a regular git blob
            )
            existing = files.get(path)
            oid = (existing["sha256"] if existing["lfs"] else existing["oid"]) if existing else None
            answers.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular",
                            "shouldIgnore": False, "oid": oid})  # fmt: skip
        self._json({"files": answers, "commitOid": sha})

    def h_commit(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        if _truthy(self.query.get("create_pr", ["0"])[0]):
            raise HubError(400, "Pull requests are not supported by this local hub")
        lines = [line for line in self._read_body().splitlines() if line.strip()]
        p, _ = self._writable(rtype, repo_id)
        try:
            items = [json.loads(line) for line in lines]
        except ValueError:
            raise HubError(400, "Commit payload is not valid NDJSON") from None
        if not items or items[0].get("key") != "header":
            raise HubError(400, "Commit payload must start with a header line")
        operations = [(item.get("key"), item.get("value") or {}) for item in items[1:]]
        for _, value in operations:
            if value.get("content") and len(value["content"]) * 3 // 4 > self.hub.lfs_threshold:
                raise HubError(400, f"{value.get('path')} is too large for a regular file: use LFS")
        sha = self.hub.store.commit(rtype, repo_id, unquote(m["rev"]), operations, items[0]["value"], p.user)
        self._json({
            "success": True, "commitOid": sha, "hookOutput": "", "pullRequestUrl": None,
            "commitUrl": f"{self._base_url()}/{URL_PREFIX[rtype]}{repo_id}/commit/{sha}",
        })  # fmt: skip

    def h_lfs_batch(self, m) -> None:
        """Git LFS batch API: an upload + verify href per object not stored yet."""
        rtype = "datasets" if m["prefix"] else "models"
        repo_id = m["repo_id"]
        body = self._json_body()
        if body.get("operation") != "upload":
            raise HubError(400, "Only the 'upload' operation is supported")
        self._writable(rtype, repo_id)
        objects = []
        for obj in body.get("objects") or []:
            oid, size = obj.get("oid"), obj.get("size")
            answer = {"oid": str(oid), "size": size if isinstance(size, int) else -1}
            if not (isinstance(oid, str) and re.fullmatch(r"[0-9a-f]{64}", oid)) or not isinstance(size, int):
                answer["error"] = {"code": 422, "message": "Invalid oid or size"}
            elif not self.hub.store.has_blob(oid, size):
                ticket = self.hub._new_ticket(oid, size)
                answer["authenticated"] = True
                answer["actions"] = {
                    "upload": {"href": f"{self._base_url()}/_lfs/upload/{ticket}", "header": {}},
                    "verify": {"href": f"{self._base_url()}/_lfs/verify/{ticket}", "header": {}},
                }
            objects.append(answer)
        self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                   content_type="application/vnd.git-lfs+json")  # fmt: skip

    def h_lfs_put(self, m) -> None:
        """The upload href: stream the body to disk, check sha256 and size, then store it."""
        oid, size = self.hub._ticket(m["ticket"])
        tmp, digest, received = self.hub.store.new_tmp_path(), hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as out:
                for piece in self._iter_body():
                    digest.update(piece)
                    out.write(piece)
                    received += len(piece)
            if received != size or digest.hexdigest() != oid:
                raise HubError(400, f"Uploaded content does not match oid {oid} / size {size}")
            self.hub.store.adopt_blob(tmp, oid)
        finally:
            tmp.unlink(missing_ok=True)
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def h_lfs_verify(self, m) -> None:
        oid, size = self.hub._ticket(m["ticket"])
        body = self._json_body()
        if body.get("oid") != oid or not self.hub.store.has_blob(oid, body.get("size", size)):
            raise HubError(404, f"LFS object {oid} is not stored (or has another size)")
        self._json({"success": True})

    # -- API: listings and downloads -----------------------------------------------------------

    def _paginated(self, items: list) -> None:
        """Answer a page of `items` with a GitHub-style Link header to the next one."""
        size = self.hub.page_size
        cursor = int(self.query.get("cursor", ["0"])[0] or 0)
        headers = {}
        if cursor + size < len(items):
            query = {k: v[0] for k, v in self.query.items()} | {"cursor": str(cursor + size)}
            headers["Link"] = f'<{self._base_url()}{self.route_path}?{urlencode(query)}>; rel="next"'
        self._json(items[cursor : cursor + size], headers=headers)

    def h_tree(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        path = unquote(m["path"] or "").strip("/")
        items = tree_items(files, path, _truthy(self.query.get("recursive", ["false"])[0]))
        if _truthy(self.query.get("expand", ["false"])[0]):
            add_last_commits(self.hub.store, rtype, repo_id, sha, items)
        self._paginated(items)

    def h_paths_info(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        form = parse_qs(self._read_body().decode())
        self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        items = []
        for path in (p.strip("/") for p in form.get("paths", [])):
            if path in files:
                items.append(_file_item(path, files[path]))
            elif any(p.startswith(path + "/") for p in files):
                items.append(_dir_item(path, files))
        if _truthy(form.get("expand", ["false"])[0]):
            add_last_commits(self.hub.store, rtype, repo_id, sha, items)
        self._json(items)

    def h_resolve(self, m) -> None:
        """Download a file; HEAD gives the metadata hf_hub_download needs."""
        rtype = "datasets" if m["prefix"] else "models"
        repo_id = m["repo_id"]
        self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        path = unquote(m["path"])
        entry = files.get(path)
        if entry is None:  # X-Repo-Commit lets the client cache the non-existence
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "ETag": f'"{entry["oid"]}"'}
        if entry["lfs"]:
            headers.update({"ETag": f'"{entry["sha256"]}"', "X-Linked-Etag": f'"{entry["sha256"]}"',
                            "X-Linked-Size": str(entry["size"])})  # fmt: skip
        self._send_file(self.hub.store.blob_path(entry["sha256"]), entry["size"], headers)

    def _send_file(self, blob: Path, size: int, headers: dict) -> None:
        start, end, status = 0, size - 1, 200
        range_header = self.headers.get("Range")
        if range_header:
            match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", range_header)
            if not match or match.groups() == ("", ""):
                raise HubError(416, f"Unsupported Range: {range_header}", headers={"Content-Range": f"bytes */{size}"})
            first, last = match.groups()
            start, end = (int(first), int(last or size - 1)) if first else (max(0, size - int(last)), size - 1)
            end = min(end, size - 1)
            if start > end:
                raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._start(status, headers, end - start + 1, "application/octet-stream")
        if self.command == "HEAD":
            return
        with open(blob, "rb") as f:
            f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                data = f.read(min(CHUNK, remaining))
                self._write(data)
                remaining -= len(data)

    # -- test control plane ---------------------------------------------------------------------

    def _test_api(self) -> None:
        hub, route, method = self.hub, self.route_path, self.command
        if route == "/_test/health":
            return self._json({"ok": True})
        if route == "/_test/log" and method in ("GET", "DELETE"):
            if method == "DELETE":
                hub.clear_log()
            return self._json({"requests": hub.request_log()})
        if route == "/_test/faults" and method == "GET":
            return self._json({"faults": hub.faults.snapshot()})
        if route == "/_test/faults" and method == "DELETE":
            hub.faults.clear()
            return self._json({"faults": []})
        if route == "/_test/faults" and method == "POST":
            body = self._json_body()
            try:
                ids = [hub.add_fault(**spec) for spec in body.get("faults", [body])]
            except (TypeError, ValueError) as err:
                raise HubError(400, f"Bad fault: {err}") from None
            return self._json({"ids": ids})
        if route == "/_test/tokens" and method == "POST":
            body = self._json_body()
            hub.add_token(body["token"], body["user"], body.get("role", "write"), body.get("orgs", ()))
            return self._json({"user": body["user"], "role": body.get("role", "write")})
        if route == "/_test/reset" and method == "POST":
            hub.reset()
            return self._json({"ok": True})
        raise HubError(404, f"Unknown test route: {method} {route}")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def handle_error(self, request, client_address):
        pass  # connection resets are expected under fault injection; real errors are answered 500


# --------------------------------------------------------------------------------------------
# Public server object
# --------------------------------------------------------------------------------------------


class HubServer:
    """The fake Hub, in a background thread. Use as a context manager or start()/stop()."""

    def __init__(self, root, tokens: dict | None = None, host: str = "127.0.0.1", port: int = 0,
                 lfs_threshold: int = LFS_THRESHOLD, page_size: int = 1000, verbose: bool = False):  # fmt: skip
        self.store = RepoStore(root)
        self.faults = FaultInjector()
        self.lfs_threshold = lfs_threshold  # files above this many bytes must go through LFS
        self.page_size = page_size  # items per page of tree/commits listings
        self.verbose = verbose
        self._address = (host, port)
        self._tokens: dict[str, Principal] = {}
        for token, cfg in (DEFAULT_TOKENS if tokens is None else tokens).items():
            self.add_token(token, cfg["user"], cfg.get("role", "write"), cfg.get("orgs", ()))
        self._tickets: dict[str, tuple[str, int]] = {}
        self._log: list[dict] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> HubServer:
        self._httpd = _HTTPServer(self._address, _Handler)
        self._httpd.hub = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="hubserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes up stalled requests
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self._httpd.server_address[0]}:{self.port}"

    # -- configuration at runtime ----------------------------------------------------------------

    def add_token(self, token: str, user: str, role: str = "write", orgs=()) -> None:
        if role not in ("read", "write"):
            raise ValueError(f"role must be 'read' or 'write', not {role!r}")
        self._tokens[token] = Principal(user=user, role=role, orgs=tuple(orgs))

    def add_fault(self, kind: str = "status", **fields) -> int:
        """Register a fault (see the module docstring); returns its id."""
        return self.faults.add({"kind": kind, **fields})

    def fault(self, fault_id: int) -> dict:
        """The current state of one fault, including its `hits`."""
        return next(f for f in self.faults.snapshot() if f["id"] == fault_id)

    def clear_faults(self) -> None:
        self.faults.clear()

    def reset(self) -> None:
        self.faults.clear()
        self.clear_log()

    # -- request log -----------------------------------------------------------------------------

    def _open_entry(self, handler: _Handler) -> dict:
        """Log a request on arrival (status None until answered; stays None if dropped)."""
        entry = {
            "method": handler.command, "path": handler.route_path, "status": None,
            "fault": None, "fault_id": None, "user": None, "range": handler.headers.get("Range"),
            "content_length": handler.headers.get("Content-Length"), "duration_s": None,
            "_started": time.monotonic(),
        }  # fmt: skip
        with self._lock:
            entry["seq"] = len(self._log)
            self._log.append(entry)
        return entry

    def _close_entry(self, entry: dict, status: int | None, user: str | None) -> None:
        with self._lock:
            entry.update(status=status, user=user, duration_s=round(time.monotonic() - entry["_started"], 3))
        if self.verbose:
            fault = f" [fault {entry['fault']}]" if entry["fault"] else ""
            print(f"hubserver: {entry['method']} {entry['path']} -> {status}{fault}", file=sys.stderr, flush=True)

    def request_log(self, method: str | None = None, path: str | None = None, status: int | None = None) -> list:
        """Logged requests (oldest first), filtered by method, path substring and status."""
        with self._lock:
            entries = [{k: v for k, v in e.items() if not k.startswith("_")} for e in self._log]
        return [
            e for e in entries
            if (method is None or e["method"] == method)
            and (path is None or path in e["path"])
            and (status is None or e["status"] == status)
        ]  # fmt: skip

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # -- LFS upload tickets ----------------------------------------------------------------------

    def _new_ticket(self, oid: str, size: int) -> str:
        """An unguessable upload URL component: LFS PUTs carry no Authorization, like S3 URLs."""
        ticket = secrets.token_hex(16)
        with self._lock:
            self._tickets[ticket] = (oid, size)
        return ticket

    def _ticket(self, ticket: str) -> tuple[str, int]:
        with self._lock:
            if ticket not in self._tickets:
                raise HubError(404, "Unknown or expired LFS upload URL")
            return self._tickets[ticket]


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parse_tokens(args) -> dict | None:
    if not args.token and not args.tokens_file:
        return None  # DEFAULT_TOKENS
    tokens = json.loads(Path(args.tokens_file).read_text()) if args.tokens_file else {}
    for spec in args.token:
        token, _, rest = spec.partition("=")
        user, _, role = rest.partition(":")
        if not token or not user:
            raise SystemExit(f"--token expects TOKEN=USER[:ROLE], got {spec.split('=')[0][:4]}...")
        tokens[token] = {"user": user, "role": role or "write"}
    return tokens


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Local fake of the Hugging Face Hub HTTP API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--root", required=True, help="directory holding the repos")
    parser.add_argument("--port-file", help="write the chosen port to this file once listening")
    parser.add_argument("--token", action="append", default=[], help="TOKEN=USER[:read|write], repeatable")
    parser.add_argument("--tokens-file", help='JSON {"TOKEN": {"user": ..., "role": ..., "orgs": [...]}}')
    parser.add_argument("--lfs-threshold", type=int, default=LFS_THRESHOLD)
    parser.add_argument("--verbose", action="store_true", help="one stderr line per request")
    args = parser.parse_args(argv)

    server = HubServer(args.root, tokens=_parse_tokens(args), host=args.host, port=args.port,
                       lfs_threshold=args.lfs_threshold, verbose=args.verbose).start()  # fmt: skip
    print(f"hubserver listening on {server.url} (port {server.port}, root {args.root})", flush=True)
    if args.port_file:  # written atomically so a poller never reads a half-written port
        tmp = f"{args.port_file}.tmp"
        Path(tmp).write_text(f"{server.port}\n")
        os.replace(tmp, args.port_file)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
