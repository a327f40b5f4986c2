"""The background uploader in the controller: when checkpoints go up, never how.

One thread runs a round every `interval_s`: the newest complete checkpoint the Hub lacks goes up
(manifest.FolderSender), then retention (retention.Retention). A failed round is retried after a
backoff; flush() asks for the newest checkpoint now (a SIGTERM's grace), and finish() sends final/,
the run's reports and the model card at the end. Upload failures are logged, never raised: training
goes on without the Hub.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import checkpoints
from ..console import say
from ..events import UPLOAD_FILE, EventLog, HubBehind, UploadFinished, UploadStarted
from . import transport
from .card import upload_reports
from .errors import TokenFound, http_status, redact, retry_after, short_error, transient
from .layout import ROOT, checkpoint_prefix, final_done, hub_checkpoints
from .manifest import FolderSender, Vanished
from .preflight import HubTarget
from .progress import UploadWatch
from .retention import Retention

URGENT_RETRY_S = 5.0  # during flush(), a failed upload is retried this soon (a SIGTERM grace is minutes)


@dataclass
class Backoff:
    """Seconds until the next round: the interval after a success; after failures `retry_s`, doubling up to
    the interval, at most URGENT_RETRY_S while a flush waits; never sooner than a 429's Retry-After."""

    interval_s: float
    retry_s: float
    failures: int = 0
    urgent: bool = False  # a flush is waiting
    delay: float = field(init=False)

    def __post_init__(self) -> None:
        self.delay = self.interval_s

    def succeeded(self) -> None:
        self.failures, self.delay = 0, self.interval_s

    def failed(self, e: BaseException) -> float:
        self.failures += 1
        wait = min(self.interval_s, self.retry_s * 2 ** (self.failures - 1))
        self.delay = max(min(wait, URGENT_RETRY_S) if self.urgent else wait, retry_after(e) or 0)
        return self.delay

    def hurry(self) -> None:
        self.urgent = True
        self.delay = min(self.delay, URGENT_RETRY_S)


@dataclass
class HubState:
    """What the Hub holds, as last listed, and what this uploader sent there."""

    steps: list[int] = field(default_factory=list)  # steps whose manifest is on the Hub
    final: bool = False  # final/'s manifest is on the Hub
    refused: set[int] = field(default_factory=set)  # steps never to try again (a file holds the token)
    records: list[dict[str, Any]] = field(default_factory=list)  # one per upload: bytes, seconds, rate

    def listed(self, files: set[str]) -> None:
        self.steps = hub_checkpoints(files)[0]
        self.final = final_done(files)


class Uploader:
    """Every `interval_s`, the newest complete checkpoint not yet on the Hub goes up, from one background thread."""

    def __init__(self, target: HubTarget, output_dir: Path, interval_s: float, keep: int,
                 retry_s: float | None = None, log: Callable[[str], None] | None = None,
                 events: EventLog | None = None, progress_every_s: float = 30.0):
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # tqdm bars from a background thread garble the ranks' log lines
        transport.for_uploads()  # Git LFS from here on, the downloads of the start through Xet (transport.py)
        self.target, self.out = target, Path(output_dir)
        self._print = log or say
        self.events = events or EventLog(None)
        interval_s = float(interval_s)
        self._backoff = Backoff(interval_s, retry_s if retry_s is not None else min(30.0, interval_s / 2))
        # progress in run/upload.json each second (for `status`), in the log every progress_every_s
        self.watch = UploadWatch(self.out / "run" / UPLOAD_FILE, self._log, progress_every_s)
        self._sender = FolderSender(target.api, target.repo_id, self.out / "run" / "upload-staging", self._log,
                                    target.revision, self.watch)
        self._retention = Retention(target.api, target.repo_id, keep, self._log, target.revision)
        self._hub = HubState()
        self._upload_lock = threading.Lock()  # held by every upload: never two at once
        self._cond = threading.Condition()  # guards _hub, _backoff and _stopping; notified after every round
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.last_error: str | None = None

    def _log(self, message: str) -> None:
        self._print("upload: " + redact(message, self.target.api.token))

    # -- the background thread -------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread; its first round is one interval from now."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._sender.clear_staging()
        with self._cond:
            self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="hub-uploader", daemon=True)
        self._thread.start()
        interval = self._backoff.interval_s
        every = f"{interval / 60:g} min" if interval >= 120 else f"{interval:g} s"
        self._log(f"every {every} the newest complete checkpoint goes to {self.target.url} "
                  f"(private; the newest {self._retention.keep} kept)")

    def stop(self, timeout_s: float | None = None) -> None:
        """End the background thread after the round in progress (an upload is never cut off here)."""
        with self._cond:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._backoff.delay)
            self._wake.clear()
            with self._cond:
                if self._stopping:
                    return
            if self._round():
                with self._cond:
                    self._backoff.succeeded()
            self._report_behind()
            with self._cond:
                self._cond.notify_all()

    def _report_behind(self) -> None:
        with self._cond:
            newest = max(self._hub.steps, default=None)
        pending, minutes = self._pending(newest)
        self.events.emit(HubBehind(checkpoints=len(pending), minutes=round(minutes, 1),
                                   newest_on_hub=f"checkpoint-{newest}" if newest is not None else None))

    def _round(self) -> bool:
        """List the Hub, upload the newest complete checkpoint it lacks, apply retention; False: retry soon."""
        with self._upload_lock:
            try:
                for _ in range(3):  # a checkpoint rotated away mid-snapshot: the next newest one
                    try:
                        self._upload_newest()
                        break
                    except Vanished as e:
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
            self._send(candidate, checkpoint_prefix(candidate.name), checkpoints.problem, hub_files)
            hub_files = self._hub_files()
        deleted = self._retention.apply(hub_files)
        with self._cond:
            self._hub.steps = [s for s in self._hub.steps if s not in deleted]

    def _send(self, src: Path, prefix: str, complete: Callable[[Path], str | None], hub_files: set[str]) -> None:
        """`src` to `prefix/` on the Hub, its record kept; a checkpoint holding the token is never tried again."""
        began = time.monotonic()
        try:
            prepared = self._sender.prepare(src, prefix, complete)
        except TokenFound:
            if prefix:
                with self._cond:
                    self._hub.refused.add(checkpoints.step_of(Path(prefix)))
            raise
        size = prepared.manifest["total_bytes"]
        self.events.emit(UploadStarted(folder=prepared.name, bytes=size))
        try:
            record = self._sender.send(prepared, hub_files)
        except Exception as e:
            self.events.emit(UploadFinished(folder=prepared.name, bytes=size, mb_per_s=None, ok=False,
                                            seconds=round(time.monotonic() - began, 2),
                                            error=redact(short_error(e), self.target.api.token)))
            raise
        record["total_seconds"] = round(time.monotonic() - began, 2)  # with the snapshot and hashing
        self.events.emit(UploadFinished(folder=record["folder"], bytes=record["bytes"], seconds=record["total_seconds"],
                                        mb_per_s=record["mb_per_s"]))
        with self._cond:
            self._hub.records.append(record)

    def _hub_files(self) -> set[str]:
        files = set(self.target.api.list_repo_files(self.target.repo_id, revision=self.target.revision))
        with self._cond:
            self._hub.listed(files)
        return files

    def _local_complete(self) -> list[Path]:
        return [c for c in checkpoints.all_checkpoints(self.out) if checkpoints.problem(c) is None]

    def _candidate(self) -> Path | None:
        """The newest complete checkpoint on disk, if the Hub lacks it (older ones waiting lose to it)."""
        done = self._local_complete()
        if not done:
            return None
        step = checkpoints.step_of(done[-1])
        return None if step in self._hub.steps or step in self._hub.refused else done[-1]

    def _failed(self, e: Exception) -> None:
        """Log a failed round; the next one comes after the backoff."""
        status = http_status(e)
        self.last_error = redact(short_error(e), self.target.api.token)
        with self._cond:
            wait = self._backoff.failed(e)
        if isinstance(e, TokenFound):
            self._log(f"error: {e}")
        elif status in (401, 403):
            self._log(f"error: the Hub refused to write to {self.target.repo_id} ({status}: {self.last_error}): "
                      "checkpoints are NOT reaching the Hub; training goes on. Check HF_TOKEN's write access. "
                      f"{self.behind()}")
        else:
            self._log(f"warning: upload failed ({self.last_error}); retrying in about {wait:.1f} s. {self.behind()}")

    # -- asked by the controller -----------------------------------------------------------------

    def _pending(self, newest: int | None) -> tuple[list[Path], float]:
        """Complete checkpoints on disk newer than the Hub's newest, and minutes since the oldest of them."""
        pending = [c for c in self._local_complete() if newest is None or checkpoints.step_of(c) > newest]
        try:
            minutes = (time.time() - (pending[0] / "trainer_state.json").stat().st_mtime) / 60 if pending else 0.0
        except OSError:
            minutes = 0.0
        return pending, minutes

    def last_upload_seconds(self) -> float | None:
        """What the newest checkpoint's upload took here, snapshot and hashing included (None: none yet)."""
        with self._cond:
            done = [r for r in self._hub.records if r.get("path")]
        return done[-1].get("total_seconds", done[-1]["seconds"]) if done else None

    def behind(self) -> str:
        """How far the Hub trails the disk, e.g. 'Hub is 2 checkpoints / 41 min behind'."""
        with self._cond:
            newest = max(self._hub.steps, default=None)
        pending, minutes = self._pending(newest)
        if not pending:
            return "The Hub has the newest complete checkpoint."
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
            self._backoff.hurry()
            self._wake.set()
            ok = self._cond.wait_for(lambda: max(self._hub.steps, default=-1) >= target or target in self._hub.refused,
                                     timeout=timeout_s)
            self._backoff.urgent = False
            ok = ok and target not in self._hub.refused
        self._log(f"flush: checkpoint-{target} is on the Hub" if ok else f"flush: not done in {timeout_s:.0f} s. "
                  f"{self.behind()}")
        return ok

    def uploaded(self) -> dict[str, Any]:
        """What is on the Hub, for the run summary: repo, checkpoints there, each upload's bytes, seconds, rate."""
        with self._cond:
            records, steps, final = list(self._hub.records), list(self._hub.steps), self._hub.final
        total_bytes = sum(r["bytes"] for r in records)
        seconds = sum(r["seconds"] for r in records)
        return {"repo": self.target.repo_id, "url": self.target.url, "checkpoints": [f"checkpoint-{s}" for s in steps],
                "final": final, "uploads": records, "bytes": total_bytes, "seconds": round(seconds, 1),
                "mb_per_s": round(total_bytes / 1e6 / seconds, 1) if seconds else None,
                "last_error": self.last_error, "behind": self.behind()}

    # -- the end of the run ----------------------------------------------------------------------

    def finish(self, final_dir: Path, run_dir: Path, summary: dict[str, Any] | None = None,
               timeout_s: float = 3600.0) -> list[str]:
        """final/ (manifest last), the run's reports and a model card; returns what did not reach the Hub. Not the
        newest checkpoint: final/ is its model files, and its training state only resumes a run, which a finished
        one is not (its upload would keep the job from exiting for the optimizer state's size)."""
        deadline = time.monotonic() + timeout_s
        self.stop(max(0.0, deadline - time.monotonic()))
        if not self._upload_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return ["final/ (an earlier upload was still running)", "run reports and model card"]
        try:
            missing = self._until(deadline, "final/", lambda: self._upload_final(Path(final_dir)))
            missing += self._until(deadline, "run reports and model card", lambda: upload_reports(
                self.target.api, self.target.repo_id, Path(run_dir), summary, self.target.revision))
        finally:
            self._upload_lock.release()
        self._log("not on the Hub: " + "; ".join(missing) if missing else
                  f"final model, reports and model card are on {self.target.url}")
        return missing

    def _until(self, deadline: float, what: str, upload: Callable[[], None]) -> list[str]:
        """Try `upload` with backoff until it succeeds or `deadline`; [] or ['what (why)']."""
        token = self.target.api.token
        for attempt in range(1, 1000):
            try:
                upload()
                return []
            except (FileNotFoundError, TokenFound) as e:  # retrying cannot help
                return [f"{what} ({redact(str(e), token)})"]
            except Exception as e:  # noqa: BLE001 - reported as missing, never raised
                self.last_error = redact(short_error(e), token)
                wait = max(min(self._backoff.retry_s * 2 ** (attempt - 1), 60.0), retry_after(e) or 0)
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
        self._send(final_dir, ROOT, whole, self._hub_files())
        with self._cond:
            self._hub.final = True
