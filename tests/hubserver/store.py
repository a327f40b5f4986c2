"""Repos, commits and file contents on disk: the state the API serves, readable by tests directly."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
from pathlib import Path

from .common import (
    DEFAULT_GITATTRIBUTES,
    LFS_POINTER,
    REPO_ID,
    REPO_TYPES,
    HubError,
    _clean_repo_path,
    _now_iso,
    git_blob_oid,
)


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
    Every file is renamed into place whole, so another process (a test) may read the store while
    the server writes it; such a reader can see a new repo before it has a `main` branch.
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
        with self.lock:
            self.meta(rtype, repo_id)  # 404 if missing
            shutil.rmtree(self._repo_dir(rtype, repo_id))

    def update_meta(self, rtype: str, repo_id: str, **changes) -> dict:
        with self.lock:
            meta = self.meta(rtype, repo_id)
            meta.update(changes)
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)
            return meta

    def create_branch(self, rtype: str, repo_id: str, branch: str, starting_point: str | None = None) -> None:
        """A branch at `starting_point` (a branch or commit; default: main's head); 409 if it exists."""
        with self.lock:
            meta = self.meta(rtype, repo_id)
            if branch in meta["refs"]:
                raise HubError(409, f"Reference refs/heads/{branch} already exists")
            meta["refs"][branch] = self.resolve(rtype, repo_id, starting_point or "main")
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)

    def delete_branch(self, rtype: str, repo_id: str, branch: str) -> None:
        with self.lock:
            meta = self.meta(rtype, repo_id)
            if branch not in meta["refs"] or branch == "main":
                raise HubError(404 if branch not in meta["refs"] else 403, f"Cannot delete branch {branch}")
            del meta["refs"][branch]
            self._write_json(self._repo_dir(rtype, repo_id) / "meta.json", meta)

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
