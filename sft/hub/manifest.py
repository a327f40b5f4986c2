"""The manifest protocol: how a folder goes up to the Hub whole, and how a download is checked.

A folder (checkpoint-N/ or final/) is hard-linked into a snapshot, since the Trainer may delete it
meanwhile; every file is hashed (and searched for the token); the files go up in one commit, then
manifest.json, listing each file's size and sha256, in a commit of its own. A folder on the Hub
counts only once its manifest is there, and a download counts only once it matches the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..units import size_text
from .errors import TokenFound
from .layout import FINAL_NAME, KEEP_AT_ROOT, MANIFEST, in_repo

if TYPE_CHECKING:
    from .progress import UploadWatch

MANIFEST_FORMAT = 1
HASH_CHUNK = 8 * 2**20  # bytes per read: hashlib releases the GIL on buffers this large
HASH_THREADS = 4  # sha256 runs at about 1-2 GB/s a core: a 115 GB checkpoint hashes in about a minute


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- files and hashes ----------------------------------------------------------------------------


def _listing(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file()]


def snapshot(src: Path, dest: Path) -> Path:
    """Hard-link every file of `src` under `dest` (copy where links fail): the Trainer may delete `src` meanwhile.

    Raises FileNotFoundError if `src` lost a file during the snapshot (a rotation had begun).
    """
    shutil.rmtree(dest, ignore_errors=True)
    files = _listing(src)
    for path in files:
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except FileNotFoundError:
            raise
        except OSError:  # a filesystem without hard links: a copy costs disk, but is as safe
            shutil.copy2(path, target)
    # A listing taken while the Trainer's rmtree ran would be short yet look whole: list again.
    if _listing(src) != files:
        raise FileNotFoundError(f"{src} changed during its snapshot")
    return dest


def hash_file(path: Path, token: str | None = None) -> tuple[str, int]:
    """sha256 and size of a file in one read; raises TokenFound if the token's bytes are in it."""
    digest, size = hashlib.sha256(), 0
    needle = token.encode() if token else b""
    tail = b""  # the previous chunk's last bytes: the token may straddle two reads
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if needle and (needle in chunk or needle in tail + chunk[: len(needle) - 1]):
                raise TokenFound(f"{path} contains the Hub token")
            tail = chunk[-(len(needle) - 1):] if len(needle) > 1 else b""
    return digest.hexdigest(), size


# -- manifests -----------------------------------------------------------------------------------


def manifest_files(root: Path) -> list[Path]:
    """The files a manifest lists: all under `root` but a manifest of its own (from a download)."""
    return [p for p in _listing(root) if p.relative_to(root).as_posix() != MANIFEST]


def build_manifest(root: Path, token: str | None = None) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """The manifest of `root` (every file, size, sha256), and each file's (size, mtime) to detect later changes."""
    paths = manifest_files(root)
    stats = {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in paths}
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        hashed = list(pool.map(lambda p: hash_file(p, token), paths))
    files = {}
    for (rel, (size, _)), (digest, read) in zip(stats.items(), hashed):
        if read != size:
            raise RuntimeError(f"{root / rel} changed while it was hashed")
        files[rel] = {"size": size, "sha256": digest}
    manifest = {"format": MANIFEST_FORMAT, "folder": root.name, "created": now_iso(),
                "total_bytes": sum(f["size"] for f in files.values()), "files": files}
    return manifest, stats


def verify(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """What in `folder` differs from the manifest: missing files, sizes, sha256s ([] when whole)."""
    problems, to_hash = [], []
    for rel, entry in manifest.get("files", {}).items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"{rel} has {path.stat().st_size} bytes, the manifest says {entry['size']}")
        else:
            to_hash.append((rel, path, entry["sha256"]))
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = list(pool.map(lambda item: hash_file(item[1])[0], to_hash))
    problems += [f"{rel}: sha256 differs from the manifest" for (rel, _, want), got in zip(to_hash, digests)
                 if got != want]
    return problems


# -- one folder up -------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A folder snapshotted and hashed, ready to go up (kept across retries: hashing 115 GB takes a minute)."""

    prefix: str  # where it goes in the repo: checkpoints/checkpoint-N, or '' (the root) for the final model
    staged: Path
    manifest: dict[str, Any]
    stats: dict[str, tuple[int, int]]

    @property
    def name(self) -> str:
        """As logs and commit titles name it: checkpoint-N, or final."""
        return self.prefix.rsplit("/", 1)[-1] or FINAL_NAME

    def unchanged(self) -> bool:
        try:
            return all(((st := (self.staged / rel).stat()).st_size, st.st_mtime_ns) == v
                       for rel, v in self.stats.items())
        except FileNotFoundError:
            return False


class Vanished(Exception):
    """The folder was rotated away before its snapshot was whole."""


class FolderSender:
    """Sends a folder into `prefix/` of the repo (or its root) by the manifest protocol, on branch `revision`;
    one send at a time (the caller's lock). `watch` follows the bytes as they go."""

    def __init__(self, api, repo_id: str, staging: Path, log: Callable[[str], None], revision: str | None = None,
                 watch: UploadWatch | None = None):
        self.api, self.repo, self.staging, self._log = api, repo_id, staging, log
        self.revision, self.watch = revision, watch
        self._prepared: Prepared | None = None  # the last snapshot, reused by a retry of the same folder

    def clear_staging(self) -> None:
        """Remove an earlier start's snapshots: hard links, so no data goes with them."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def prepare(self, src: Path, prefix: str, complete: Callable[[Path], str | None]) -> Prepared:
        """Snapshot and hash `src`, or reuse the last snapshot of the same folder if it did not change.

        Raises Vanished if `complete` (None when whole, else why not) finds the snapshot torn, and
        TokenFound if a file holds the token.
        """
        p = self._prepared
        if p is not None and p.prefix == prefix and p.unchanged():
            return p
        name = prefix.rsplit("/", 1)[-1] or FINAL_NAME
        staged = self.staging / name
        try:
            snapshot(src, staged)
        except FileNotFoundError:
            raise Vanished(f"{name} was deleted by the Trainer during its snapshot") from None
        if (why := complete(staged)) is not None:
            raise Vanished(f"{name} was deleted by the Trainer during its snapshot ({why})")
        if self.watch is not None:
            self.watch.begin(name, sum(p.stat().st_size for p in manifest_files(staged)), "hashing")
        try:
            manifest, stats = build_manifest(staged, self.api.token)
        except TokenFound as e:
            shutil.rmtree(staged, ignore_errors=True)
            raise TokenFound(f"{name} not uploaded: {str(e).replace(str(staged), name)} "
                             "(never hand HF_TOKEN to the Trainer or the ranks)") from None
        self._prepared = Prepared(prefix, staged, manifest, stats)
        return self._prepared

    def send(self, p: Prepared, hub_files: set[str]) -> dict[str, Any]:
        """Commit the files, check they did not change meanwhile, then the manifest in a commit of its own.

        Returns the upload's record: folder, files, bytes, seconds, MB/s, when.
        """
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        from .progress import counted_add

        started, total = time.monotonic(), p.manifest["total_bytes"]
        if self.watch is not None:
            self.watch.begin(p.name, total, "uploading")
        ops: list[Any] = []
        for rel, entry in p.manifest["files"].items():
            op = counted_add(in_repo(p.prefix, rel), p.staged / rel, self.watch)
            op.upload_info.sha256 = bytes.fromhex(entry["sha256"])  # hashed once for the manifest, not twice
            ops.append(op)
        wanted = {op.path_in_repo for op in ops}
        # What an earlier, cut-off upload of this folder left (an old manifest included) must not outlive it.
        ops += [CommitOperationDelete(path) for path in sorted(hub_files) if _stale(path, p.prefix, wanted)]
        try:
            self.api.create_commit(self.repo, ops, commit_message=f"{p.name}: {len(wanted)} files, {size_text(total)}",
                                   revision=self.revision)
        finally:
            if self.watch is not None:
                self.watch.end()
        if not p.unchanged():
            self._prepared = None
            raise RuntimeError(f"{p.name} changed on disk during its upload; it goes up again")
        body = json.dumps(p.manifest, indent=1).encode()
        self.api.create_commit(self.repo, [CommitOperationAdd(in_repo(p.prefix, MANIFEST), body)],
                               commit_message=f"{p.name}: manifest ({len(wanted)} files, complete)",
                               revision=self.revision)
        return self._sent(p, total, time.monotonic() - started)

    def _sent(self, p: Prepared, total: int, seconds: float) -> dict[str, Any]:
        rate = total / 1e6 / seconds if seconds > 0 else None
        record = {"folder": p.name, "path": p.prefix, "files": len(p.manifest["files"]), "bytes": total,
                  "seconds": round(seconds, 2), "mb_per_s": round(rate, 1) if rate else None, "at": now_iso()}
        shutil.rmtree(p.staged, ignore_errors=True)
        self._prepared = None
        self._log(f"{p.name} is on the Hub ({size_text(total)} in {seconds:.1f} s"
                  + (f", {rate:.1f} MB/s)" if rate else ")"))
        return record


def _stale(path: str, prefix: str, wanted: set[str]) -> bool:
    """A file in the repo that an upload of `prefix` replaces: under it and not sent now. At the root (the final
    model) only the root's own files count, but the model card and .gitattributes."""
    if path in wanted:
        return False
    if prefix:
        return path.startswith(prefix + "/")
    return "/" not in path and path not in KEEP_AT_ROOT
