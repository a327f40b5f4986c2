"""Checkpoints to a private Hugging Face repo: a preflight, then a background uploader in the controller.

The repo mirrors the output folder:
    checkpoint-N/...              OUTPUT/checkpoint-N as the Trainer and DeepSpeed wrote it
    checkpoint-N/manifest.json    every file of it, with its size and sha256; committed after the files,
                                  in a commit of its own: a checkpoint is on the Hub when its manifest is
    final/..., final/manifest.json   the 16-bit model, the same way
    run/summary.json, run/loss.png, run/settings.json, ...   the run's reports
    README.md                     the model card
The Hub keeps the newest `keep` checkpoints that have a manifest; an older one is deleted only once a
newer manifest is up. The token lives in the HfApi object only: it is never logged nor written, and a
file that contains it is never uploaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from . import checkpoints, exitcodes, report
from .settings import REPO_ID, looks_local

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
FINAL = "final"
# The run's reports that go up at the end, from OUTPUT/run/ to run/ in the repo (those that exist).
RUN_FILES = ("summary.json", "loss.png", "settings.json", "ds_config.json", "probe.json")
HASH_CHUNK = 8 * 2**20  # bytes per read: hashlib releases the GIL on buffers this large
HASH_THREADS = 4  # sha256 runs at about 1-2 GB/s a core: a 115 GB checkpoint hashes in about a minute
PREFLIGHT_TRIES = 3  # whoami, repo_info and create_repo are not retried by huggingface_hub itself
URGENT_RETRY_S = 5.0  # during flush(), a failed upload is retried this soon (a SIGTERM grace is minutes)
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)  # the ones huggingface_hub's own http_backoff retries
STEP_DIR = re.compile(r"^checkpoint-(\d+)/")


class HubError(Exception):
    """The Hub cannot be used as asked; `exit_code` is one of exitcodes.HUB_* (or BAD_SETTINGS)."""

    def __init__(self, message: str, exit_code: int = exitcodes.HUB_AUTH):
        super().__init__(message)
        self.message, self.exit_code = message, exit_code


class TokenFound(Exception):
    """A file about to be uploaded contains the Hub token (the message names the file, never the token)."""


@dataclass(frozen=True)
class HubTarget:
    """A repo that preflight found private and writable, and the client that writes to it."""

    repo_id: str
    endpoint: str
    user: str
    created: bool
    api: Any = field(repr=False, compare=False)  # HfApi: it holds the token, so it is never serialised

    @property
    def url(self) -> str:
        return f"{self.endpoint}/{self.repo_id}"

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "url": self.url, "user": self.user, "created": self.created}


# --------------------------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------------------------


def preflight(repo_id: str, token: str | None, endpoint: str | None = None) -> HubTarget:
    """Before any GPU work: the token exists, whoami answers, it can write, the repo is private (made if missing)."""
    from huggingface_hub import HfApi, constants

    if not token:
        raise HubError(f"SFT_HUB_REPO={repo_id!r} needs HF_TOKEN: a Hugging Face token with write access "
                       "(https://huggingface.co/settings/tokens)", exitcodes.HUB_AUTH)
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"SFT_HUB_REPO={repo_id!r} but HF_HUB_OFFLINE=1 forbids the Hub: unset one of them",
                       exitcodes.BAD_SETTINGS)
    api = HfApi(endpoint=endpoint, token=token)
    me = _preflight_call(api, "whoami", api.whoami)
    check_write_access(me, repo_id)
    created = _ensure_private(api, repo_id)
    return HubTarget(repo_id, api.endpoint, me.get("name", "?"), created, api)


def _preflight_call(api, what: str, fn: Callable, *args, **kwargs):
    """One call of the preflight: retried when transient, a HubError when the token is refused or the Hub is out."""
    for attempt in range(1, PREFLIGHT_TRIES + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - sorted below into refused, transient, or the caller's
            status = http_status(e)
            if status == 401:
                raise HubError(f"HF_TOKEN was refused by the Hub at {api.endpoint} (401 on {what}: invalid, "
                               "expired or revoked): make a new token with write access", exitcodes.HUB_AUTH) from None
            if not transient(e):
                raise
            if attempt == PREFLIGHT_TRIES:
                raise HubError(f"the Hub at {api.endpoint} did not answer {what} after {attempt} tries "
                               f"({redact(short_error(e), api.token)}): start again later",
                               exitcodes.HUB_UNREACHABLE) from None
            time.sleep(retry_after(e) or attempt)


def check_write_access(me: dict, repo_id: str) -> None:
    """Refuse a token that whoami says cannot write to the repo: read role, fine-grained without repo.write."""
    namespace, user = repo_id.split("/")[0], me.get("name", "?")
    orgs = {o.get("name"): o for o in me.get("orgs") or []}
    if namespace != user and namespace not in orgs:
        raise HubError(f"HF_TOKEN belongs to {user!r}, who cannot write under {namespace!r}: SFT_HUB_REPO must be "
                       f"under one of {', '.join([user, *orgs])}", exitcodes.HUB_AUTH)
    access = (me.get("auth") or {}).get("accessToken") or {}
    role, name = access.get("role"), access.get("displayName", "?")
    if role == "read":
        raise HubError(f"HF_TOKEN ({name!r}) is a read-only token: SFT_HUB_REPO needs one with write access",
                       exitcodes.HUB_AUTH)
    if role == "fineGrained" and not _fine_grained_writes(access.get("fineGrained") or {}, namespace, repo_id):
        raise HubError(f"HF_TOKEN ({name!r}) is fine-grained without write access to {repo_id} "
                       "(repo.write on the repo or its owner)", exitcodes.HUB_AUTH)
    if namespace in orgs and orgs[namespace].get("roleInOrg") == "read":
        raise HubError(f"{user!r} has the read role in {namespace!r}: it cannot write {repo_id}", exitcodes.HUB_AUTH)
    # Any other role (write, admin, or none reported) is trusted here; a refusal shows on the first write.


def _fine_grained_writes(grants: dict, namespace: str, repo_id: str) -> bool:
    for scope in grants.get("scoped") or []:
        entity = scope.get("entity") or {}
        if entity.get("name") in (namespace, repo_id) and "repo.write" in (scope.get("permissions") or []):
            return True
    return False


def _ensure_private(api, repo_id: str) -> bool:
    """The repo exists and is private afterwards; True if it was created. A public repo is refused."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    created = False
    try:
        info = _preflight_call(api, f"repo_info({repo_id})", api.repo_info, repo_id)
    except RepositoryNotFoundError:
        try:
            _preflight_call(api, f"create_repo({repo_id})", api.create_repo, repo_id, private=True)
        except HfHubHTTPError as e:
            raise _create_refused(repo_id, e) from None
        info = _preflight_call(api, f"repo_info({repo_id})", api.repo_info, repo_id)
        created = True
    if info.private is not True:
        raise HubError(f"{repo_id} on {api.endpoint} is public, and this job never uploads to a public repo (a "
                       "checkpoint is the whole training state): make it private on its settings page, or set "
                       "SFT_HUB_REPO to a new name, which the job creates private", exitcodes.HUB_PUBLIC_REPO)
    print(f"hub: {'created private repo' if created else 'private repo'} {api.endpoint}/{repo_id}", flush=True)
    return created


def _create_refused(repo_id: str, e: Exception) -> HubError:
    status = http_status(e)
    if status == 409:
        return HubError(f"{repo_id} exists but HF_TOKEN cannot see it (someone else's private repo?): "
                        "pick another SFT_HUB_REPO", exitcodes.HUB_AUTH)
    if status == 403:
        return HubError(f"HF_TOKEN may not create {repo_id} (403): it needs write access to that namespace",
                        exitcodes.HUB_AUTH)
    return HubError(f"could not create {repo_id} ({short_error(e)})", exitcodes.HUB_UNREACHABLE)


# --------------------------------------------------------------------------------------------
# Errors, tokens, sizes
# --------------------------------------------------------------------------------------------


def http_status(e: BaseException) -> int | None:
    return getattr(getattr(e, "response", None), "status_code", None)


def retry_after(e: BaseException) -> float | None:
    """Seconds the Hub asked to wait (a 429's Retry-After), if it did."""
    headers = getattr(getattr(e, "response", None), "headers", None) or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def transient(e: BaseException | None) -> bool:
    """A failure a later try may not meet: no answer, 408, 429, 5xx; not a refusal nor a bad request."""
    seen = 0
    while e is not None and seen < 10:  # huggingface_hub wraps LFS failures: the HTTP error is a cause
        status = http_status(e)
        if status is not None:
            return status in RETRY_STATUSES
        e, seen = e.__cause__ or e.__context__, seen + 1
    return True


def short_error(e: BaseException) -> str:
    """The first line of an error, with its type: huggingface_hub's messages run to several lines."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "hf_***") if token else text


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------
# Snapshots and manifests
# --------------------------------------------------------------------------------------------


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
    manifest = {"format": MANIFEST_FORMAT, "folder": root.name, "created": _now_iso(),
                "total_bytes": sum(f["size"] for f in files.values()), "files": files}
    return manifest, stats


def hub_checkpoints(paths: Iterable[str]) -> tuple[list[int], list[int]]:
    """From a repo's file list: (steps whose manifest is up, steps with any file), oldest first."""
    complete, present = set(), set()
    for path in paths:
        if m := STEP_DIR.match(path):
            present.add(int(m.group(1)))
            if path == f"checkpoint-{m.group(1)}/{MANIFEST}":
                complete.add(int(m.group(1)))
    return sorted(complete), sorted(present)


@dataclass
class _Prepared:
    """A folder snapshotted and hashed, ready to go up (kept across retries: hashing 115 GB takes a minute)."""

    prefix: str
    staged: Path
    manifest: dict[str, Any]
    stats: dict[str, tuple[int, int]]

    def unchanged(self) -> bool:
        try:
            return all(((st := (self.staged / rel).stat()).st_size, st.st_mtime_ns) == v
                       for rel, v in self.stats.items())
        except FileNotFoundError:
            return False


class _Vanished(Exception):
    """The checkpoint was rotated away before its snapshot was whole."""


# --------------------------------------------------------------------------------------------
# The uploader
# --------------------------------------------------------------------------------------------


class Uploader:
    """Every `interval_s`, the newest complete checkpoint not yet on the Hub goes up, from one background thread."""

    def __init__(self, target: HubTarget, output_dir: Path, interval_s: float, keep: int,
                 retry_s: float | None = None, log: Callable[[str], None] | None = None):
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # tqdm bars from a background thread garble the ranks' log lines
        self.target, self.api, self.repo = target, target.api, target.repo_id
        self.out = Path(output_dir)
        self.staging = self.out / "run" / "upload-staging"
        self.interval_s, self.keep = float(interval_s), int(keep)
        self.retry_s = retry_s if retry_s is not None else min(30.0, self.interval_s / 2)
        self._print = log or (lambda line: print(line, flush=True))
        self._upload_lock = threading.Lock()  # held by every upload: never two at once
        self._cond = threading.Condition()  # guards what follows; notified after every round
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = self._urgent = False
        self._hub_steps: list[int] = []  # steps whose manifest is on the Hub, as last listed
        self._final = False
        self._failures, self._delay = 0, self.interval_s
        self._refused: set[int] = set()  # steps never to try again (a file holds the token)
        self._prepared: _Prepared | None = None
        self._purge_unsupported = False  # the endpoint answered 404: a Hub without it (the local test one)
        self._records: list[dict[str, Any]] = []
        self.last_error: str | None = None

    def _log(self, message: str) -> None:
        self._print("upload: " + redact(message, self.api.token))

    def start(self) -> None:
        """Start the background thread; its first round is one interval from now."""
        if self._thread is not None and self._thread.is_alive():
            return
        shutil.rmtree(self.staging, ignore_errors=True)  # an earlier start's snapshots: hard links, no data
        with self._cond:
            self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="hub-uploader", daemon=True)
        self._thread.start()
        every = f"{self.interval_s / 60:g} min" if self.interval_s >= 120 else f"{self.interval_s:g} s"
        self._log(f"every {every} the newest complete checkpoint goes to {self.target.url} "
                  f"(private; the newest {self.keep} kept)")

    def stop(self, timeout_s: float | None = None) -> None:
        """End the background thread after the round in progress (an upload is never cut off here)."""
        with self._cond:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            with self._cond:
                if self._stopping:
                    return
            if self._round():
                with self._cond:
                    self._failures, self._delay = 0, self.interval_s
            with self._cond:
                self._cond.notify_all()

    def _round(self) -> bool:
        """List the Hub, upload the newest complete checkpoint it lacks, apply retention; False: retry soon."""
        with self._upload_lock:
            try:
                for _ in range(3):  # a checkpoint rotated away mid-snapshot: the next newest one
                    try:
                        self._upload_newest()
                        break
                    except _Vanished as e:
                        self._log(f"{e}: taking the newest again")
                self.last_error = None
                return True
            except Exception as e:  # noqa: BLE001 - an upload failure never stops training
                self._failed(e)
                return False

    def _upload_newest(self) -> None:
        hub_files = self._hub_files()
        candidate = self._candidate()
        if candidate is not None:
            prepared = self._prepare(candidate, candidate.name, complete=checkpoints.problem)
            self._send(prepared, hub_files)
            hub_files = self._hub_files()
        self._retention(hub_files)

    def _hub_files(self) -> set[str]:
        files = set(self.api.list_repo_files(self.repo))
        with self._cond:
            self._hub_steps = hub_checkpoints(files)[0]
            self._final = f"{FINAL}/{MANIFEST}" in files
        return files

    def _local_complete(self) -> list[Path]:
        return [c for c in checkpoints.all_checkpoints(self.out) if checkpoints.problem(c) is None]

    def _candidate(self) -> Path | None:
        """The newest complete checkpoint on disk, if the Hub lacks it (older ones waiting lose to it)."""
        done = self._local_complete()
        if not done:
            return None
        step = checkpoints.step_of(done[-1])
        return None if step in self._hub_steps or step in self._refused else done[-1]

    def _prepare(self, src: Path, prefix: str, complete: Callable[[Path], str | None]) -> _Prepared:
        """Snapshot and hash `src`, or reuse the last snapshot of the same folder if it did not change."""
        p = self._prepared
        if p is not None and p.prefix == prefix and p.unchanged():
            return p
        staged = self.staging / prefix
        try:
            snapshot(src, staged)
        except FileNotFoundError:
            raise _Vanished(f"{prefix} was deleted by the Trainer during its snapshot") from None
        if (why := complete(staged)) is not None:
            raise _Vanished(f"{prefix} was deleted by the Trainer during its snapshot ({why})")
        try:
            manifest, stats = build_manifest(staged, self.api.token)
        except TokenFound as e:
            if prefix.startswith("checkpoint-"):
                self._refused.add(checkpoints.step_of(Path(prefix)))
            shutil.rmtree(staged, ignore_errors=True)
            raise TokenFound(f"{prefix} not uploaded: {str(e).replace(str(staged), prefix)} "
                             "(never hand HF_TOKEN to the Trainer or the ranks)") from None
        self._prepared = _Prepared(prefix, staged, manifest, stats)
        return self._prepared

    def _send(self, p: _Prepared, hub_files: set[str]) -> None:
        """Commit the files, check they did not change meanwhile, then the manifest in a commit of its own."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        started, total = time.monotonic(), p.manifest["total_bytes"]
        ops: list[Any] = []
        for rel, entry in p.manifest["files"].items():
            op = CommitOperationAdd(path_in_repo=f"{p.prefix}/{rel}", path_or_fileobj=str(p.staged / rel))
            op.upload_info.sha256 = bytes.fromhex(entry["sha256"])  # hashed once for the manifest, not twice
            ops.append(op)
        wanted = {op.path_in_repo for op in ops}
        # What an earlier, cut-off upload of this folder left (an old manifest included) must not outlive it.
        ops += [CommitOperationDelete(path) for path in sorted(hub_files)
                if path.startswith(p.prefix + "/") and path not in wanted]
        self.api.create_commit(self.repo, ops, commit_message=f"{p.prefix}: {len(wanted)} files, {size_text(total)}")
        if not p.unchanged():
            self._prepared = None
            raise RuntimeError(f"{p.prefix} changed on disk during its upload; it goes up again")
        body = json.dumps(p.manifest, indent=1).encode()
        self.api.create_commit(self.repo, [CommitOperationAdd(f"{p.prefix}/{MANIFEST}", body)],
                               commit_message=f"{p.prefix}: manifest ({len(wanted)} files, complete)")
        self._recorded(p, total, time.monotonic() - started)

    def _recorded(self, p: _Prepared, total: int, seconds: float) -> None:
        rate = total / 1e6 / seconds if seconds > 0 else None
        with self._cond:
            self._records.append({"folder": p.prefix, "files": len(p.manifest["files"]), "bytes": total,
                                  "seconds": round(seconds, 2), "mb_per_s": round(rate, 1) if rate else None,
                                  "at": _now_iso()})
        shutil.rmtree(p.staged, ignore_errors=True)
        self._prepared = None
        self._log(f"{p.prefix} is on the Hub ({size_text(total)} in {seconds:.1f} s"
                  + (f", {rate:.1f} MB/s)" if rate else ")"))

    def _retention(self, hub_files: set[str]) -> None:
        """Delete Hub checkpoints beyond the newest `keep` with a manifest (torn older ones too)."""
        from huggingface_hub import CommitOperationDelete

        complete, present = hub_checkpoints(hub_files)
        if not complete:
            return
        kept = complete[-self.keep:]
        doomed = [s for s in present if s not in kept and s < complete[-1]]
        if not doomed:
            return
        ops = [CommitOperationDelete(f"checkpoint-{s}/", is_folder=True) for s in doomed]
        names = ", ".join(f"checkpoint-{s}" for s in doomed)
        self.api.create_commit(self.repo, ops, commit_message=f"retention: delete {names}")
        with self._cond:
            self._hub_steps = [s for s in self._hub_steps if s not in doomed]
        self._log(f"deleted {names} from the Hub (it keeps {', '.join(f'checkpoint-{s}' for s in kept)})")
        self._free_storage()

    def _free_storage(self) -> None:
        """Purge the LFS objects that only deleted checkpoints used: a deleted file stays in history, and billed."""
        if self._purge_unsupported:
            return
        try:
            head = {item.lfs.sha256 for item in self.api.list_repo_tree(self.repo, recursive=True)
                    if getattr(item, "lfs", None) is not None}
            orphans = [f for f in self.api.list_lfs_files(self.repo)
                       if STEP_DIR.match(f.filename or "") and f.file_oid not in head]
            if orphans:
                self.api.permanently_delete_lfs_files(self.repo, orphans)
                self._log(f"freed {size_text(sum(f.size for f in orphans))} of deleted checkpoints' files")
        except Exception as e:  # noqa: BLE001 - storage is freed at a later deletion; uploads go on
            self._purge_unsupported = http_status(e) in (404, 405, 501)
            why = redact(short_error(e), self.api.token)
            self._log(f"warning: could not free the storage of deleted checkpoints ({why}): their files stay in "
                      "the repo's history and count against its storage")

    def _failed(self, e: Exception) -> None:
        """Log a failed round; the next one comes after a backoff, sooner while flushing, never before a 429 allows."""
        status = http_status(e)
        self.last_error = redact(short_error(e), self.api.token)
        with self._cond:
            self._failures += 1
            wait = min(self.interval_s, self.retry_s * 2 ** (self._failures - 1))
            self._delay = wait = max(min(wait, URGENT_RETRY_S) if self._urgent else wait, retry_after(e) or 0)
        if isinstance(e, TokenFound):
            self._log(f"error: {e}")
        elif status in (401, 403):
            self._log(f"error: the Hub refused to write to {self.repo} ({status}: {self.last_error}): checkpoints "
                      f"are NOT reaching the Hub; training goes on. Check HF_TOKEN's write access. {self.behind()}")
        else:
            self._log(f"warning: upload failed ({self.last_error}); retrying in about {wait:.1f} s. {self.behind()}")

    def behind(self) -> str:
        """How far the Hub trails the disk, e.g. 'Hub is 2 checkpoints / 41 min behind'."""
        with self._cond:
            newest = max(self._hub_steps, default=None)
        pending = [c for c in self._local_complete() if newest is None or checkpoints.step_of(c) > newest]
        if not pending:
            return "The Hub has the newest complete checkpoint."
        try:
            minutes = (time.time() - (pending[0] / "trainer_state.json").stat().st_mtime) / 60
        except OSError:
            minutes = 0.0
        on_hub = f"checkpoint-{newest}" if newest is not None else "none yet"
        return f"Hub is {len(pending)} checkpoint(s) / {minutes:.0f} min behind (newest there: {on_hub})."

    def flush(self, timeout_s: float) -> bool:
        """Upload the newest complete checkpoint now if the Hub lacks it; True once it is there, False on timeout."""
        done = self._local_complete()
        if not done:
            return True
        target = checkpoints.step_of(done[-1])
        self.start()
        self._log(f"flush: checkpoint-{target} to the Hub (up to {timeout_s:.0f} s)")
        with self._cond:
            self._urgent = True
            self._delay = min(self._delay, URGENT_RETRY_S)
            self._wake.set()
            ok = self._cond.wait_for(lambda: max(self._hub_steps, default=-1) >= target or target in self._refused,
                                     timeout=timeout_s)
            self._urgent = False
            ok = ok and target not in self._refused
        self._log(f"flush: checkpoint-{target} is on the Hub" if ok else f"flush: not done in {timeout_s:.0f} s. "
                  f"{self.behind()}")
        return ok

    # -- the end of the run --------------------------------------------------------------------

    def finish(self, final_dir: Path, run_dir: Path, summary: dict[str, Any] | None = None,
               timeout_s: float = 3600.0, last_checkpoint: bool = False) -> list[str]:
        """final/ (manifest last), the run's reports and a model card; returns what did not reach the Hub."""
        deadline = time.monotonic() + timeout_s
        if last_checkpoint:
            self.flush(timeout_s / 2)
        self.stop(max(0.0, deadline - time.monotonic()))
        if not self._upload_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return ["final/ (an earlier upload was still running)", "run reports and model card"]
        try:
            missing = self._until(deadline, "final/", lambda: self._upload_final(Path(final_dir)))
            missing += self._until(deadline, "run reports and model card",
                                   lambda: self._upload_reports(Path(run_dir), summary))
        finally:
            self._upload_lock.release()
        self._log("not on the Hub: " + "; ".join(missing) if missing else
                  f"final model, reports and model card are on {self.target.url}")
        return missing

    def _until(self, deadline: float, what: str, upload: Callable[[], None]) -> list[str]:
        """Try `upload` with backoff until it succeeds or `deadline`; [] or ['what (why)']."""
        for attempt in range(1, 1000):
            try:
                upload()
                return []
            except (FileNotFoundError, TokenFound) as e:  # retrying cannot help
                return [f"{what} ({redact(str(e), self.api.token)})"]
            except Exception as e:  # noqa: BLE001 - reported as missing, never raised
                self.last_error = redact(short_error(e), self.api.token)
                wait = max(min(self.retry_s * 2 ** (attempt - 1), 60.0), retry_after(e) or 0)
                if not transient(e) or time.monotonic() + wait > deadline:
                    return [f"{what} ({self.last_error})"]
                self._log(f"warning: {what} failed ({self.last_error}); retrying in {wait:.1f} s")
                time.sleep(wait)
        return [what]

    def _upload_final(self, final_dir: Path) -> None:
        def whole(folder: Path) -> str | None:
            return None if (folder / "config.json").is_file() else "no config.json"

        if whole(final_dir) is not None:
            raise FileNotFoundError(f"{final_dir} holds no saved model (config.json)")
        prepared = self._prepare(final_dir, FINAL, complete=whole)
        self._send(prepared, self._hub_files())
        with self._cond:
            self._final = True

    def _upload_reports(self, run_dir: Path, summary: dict[str, Any] | None) -> None:
        from huggingface_hub import CommitOperationAdd

        summary = summary if summary is not None else report.read_json(run_dir / "summary.json") or {}
        ops = []
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                hash_file(run_dir / name, self.api.token)  # raises TokenFound: such a file never goes up
                ops.append(CommitOperationAdd(f"run/{name}", str(run_dir / name)))
        card = model_card(summary, self.repo)
        if self.api.token and self.api.token in card:
            raise TokenFound("the model card would contain the Hub token")
        ops.append(CommitOperationAdd("README.md", card.encode()))
        self.api.create_commit(self.repo, ops, commit_message="run reports and model card")

    def uploaded(self) -> dict[str, Any]:
        """What is on the Hub, for the run summary: repo, checkpoints there, each upload's bytes, seconds, rate."""
        with self._cond:
            records, steps, final = list(self._records), list(self._hub_steps), self._final
        total_bytes = sum(r["bytes"] for r in records)
        seconds = sum(r["seconds"] for r in records)
        return {"repo": self.repo, "url": self.target.url, "checkpoints": [f"checkpoint-{s}" for s in steps],
                "final": final, "uploads": records, "bytes": total_bytes, "seconds": round(seconds, 1),
                "mb_per_s": round(total_bytes / 1e6 / seconds, 1) if seconds else None,
                "last_error": self.last_error, "behind": self.behind()}


# --------------------------------------------------------------------------------------------
# The model card
# --------------------------------------------------------------------------------------------


def _hub_name(value: Any) -> str | None:
    """`value` if it names a Hub repo (the card's metadata may only link those), else None."""
    ok = isinstance(value, str) and "/" in value and not looks_local(value) and REPO_ID.match(value)
    return value if ok else None


def model_card(summary: dict[str, Any], repo_id: str) -> str:
    """README.md: base model, dataset, settings, final loss, and how to load the model."""
    from huggingface_hub import ModelCard, ModelCardData

    s = summary.get("settings") or {}
    train = summary.get("train") or {}
    base, dataset = _hub_name(s.get("model")), _hub_name(s.get("dataset"))
    data = ModelCardData(library_name="transformers", base_model=base, datasets=[dataset] if dataset else None,
                         tags=["trl", "sft", "deepspeed", "full-fine-tune"])
    loss = summary.get("final_loss", train.get("train_loss"))
    settings_rows = "\n".join(f"| `SFT_{k.upper()}` | `{v}` |" for k, v in s.items())
    body = f"""# {repo_id.split('/')[-1]}

Full fine-tune of `{s.get('model', '?')}` on `{s.get('dataset', '?')}` (split `{s.get('dataset_split', 'train')}`)
with TRL's SFTTrainer on DeepSpeed ZeRO {summary.get('stage', '?')}, {summary.get('ranks', '?')} rank(s).

- status: {summary.get('status', '?')}
- final training loss: {loss if loss is not None else 'n/a'}
- optimizer steps: {train.get('global_step', 'n/a')}; tokens per second: {train.get('tokens_per_second', 'n/a')}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{repo_id}", subfolder="{FINAL}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", subfolder="{FINAL}")
```

## In this repo

- `{FINAL}/`: the 16-bit model; `{FINAL}/{MANIFEST}` lists every file with its size and sha256
- `checkpoint-N/`: the newest DeepSpeed checkpoints; one is complete only with its `{MANIFEST}`
- `run/summary.json`, `run/loss.png`: the run's figures and loss curve

## Settings

| variable | value |
|---|---|
{settings_rows}
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))
