"""`entrypoint.py status`: where a run is, from its output folder (while it runs or after), or from its Hub repo.

From the folder it reads what the job writes for this: run/events.jsonl (the phase, the Hub's newest checkpoint
as the uploader last saw it, the end and its exit code), run/progress.json (the step and the ETA),
run/upload.json (an upload in progress), and the checkpoints on disk. From the Hub it lists the repo (no
output folder needed): the newest checkpoint with a manifest, its step, the final model, run/summary.json.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import checkpoints
from ..events import (EVENTS_FILE, PROGRESS_FILE, UPLOAD_FILE, CheckpointSaved, Ended, HubBehind, Progress,
                      ProbeTry, SettingsResolved, TrainStarted, UploadFinished, UploadProgress, read_events)
from ..handoff import Summary
from .heartbeat import PULSE_FILE

PHASES = {SettingsResolved: "starting", ProbeTry: "probing", TrainStarted: "training", CheckpointSaved: "training"}


@dataclass
class Status:
    """What `status` says, as text for people or JSON for programs."""

    source: str  # the folder or the repo
    phase: str  # starting, probing, training, ended, unknown
    step: int | None = None
    max_steps: int | None = None
    eta_seconds: float | None = None
    as_of: str | None = None  # when the figures above were written (UTC)
    exit_code: int | None = None
    ended_as: str | None = None  # the end's status: done, stopped for time, ...
    checkpoint_on_disk: str | None = None
    checkpoint_on_hub: str | None = None
    final_model: bool = False
    upload: str | None = None  # the upload in progress, as text

    def text(self) -> str:
        if self.phase == "unknown" and not self.checkpoint_on_disk and not self.checkpoint_on_hub:
            return (f"{self.source}: no run here yet (no run/events.jsonl, no checkpoint): not a job's output folder, "
                    "or its job has not started")
        where = f"{self.phase}" + (f": step {self.step} of {self.max_steps}" if self.step is not None else "")
        if self.eta_seconds is not None and self.phase == "training":
            where += f", about {_duration(self.eta_seconds)} left"
        lines = [f"{self.source}: {where}" + (f" (as of {self.as_of})" if self.as_of else "")]
        if self.ended_as is not None:
            lines.append(f"  ended: {self.ended_as}, exit code {self.exit_code}")
        lines.append(f"  newest complete checkpoint on disk: {self.checkpoint_on_disk or 'none'}")
        lines.append(f"  newest complete checkpoint on the Hub: {self.checkpoint_on_hub or 'none'}")
        lines.append(f"  final model: {'yes' if self.final_model else 'not yet'}")
        if self.upload:
            lines.append(f"  uploading: {self.upload}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def of_folder(out: Path) -> Status:
    """The run in output folder `out`, from this start's events (the last 'settings' line begins a start)."""
    run = out / "run"
    events = read_events(run / EVENTS_FILE)
    starts = [i for i, (_, e) in enumerate(events) if isinstance(e, SettingsResolved)]
    this = events[starts[-1]:] if starts else events
    status = Status(str(out), "unknown" if not this else "starting")
    for when, e in this:
        status.phase = next((phase for kind, phase in PHASES.items() if isinstance(e, kind)), status.phase)
        status.as_of = when
        if isinstance(e, Ended):
            status.phase, status.ended_as, status.exit_code = "ended", e.status, e.exit_code
    for _, e in events:  # the Hub as the uploader last saw it, over every start
        if isinstance(e, HubBehind) and e.newest_on_hub:
            status.checkpoint_on_hub = e.newest_on_hub
        elif isinstance(e, UploadFinished) and e.ok and e.folder.startswith("checkpoint-"):
            status.checkpoint_on_hub = _newer(status.checkpoint_on_hub, e.folder)
    progress = Progress.load(run / PROGRESS_FILE)
    if progress is not None and status.phase in ("training", "ended"):
        status.step, status.max_steps = progress.step, progress.max_steps
        status.eta_seconds = progress.eta_seconds()
        status.as_of = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(progress.updated))
    upload = UploadProgress.load(run / UPLOAD_FILE)
    if upload is not None and upload.phase != "done" and status.phase != "ended":
        status.upload = upload.text()
    newest = _quiet_latest(out)
    status.checkpoint_on_disk = newest.name if newest else None
    status.final_model = (out / "final" / "config.json").is_file()
    return status


# `status --check`'s exit codes (docs/running.md, 'Kubernetes'): a probe passes on 0 alone
HEALTHY = 0  # running, with a sign of life within --stalled-after; or ended done (exit code 0)
STALLED = 1  # not ended, and no sign of life for longer than --stalled-after: hung, or gone without an end
ENDED_NOT_DONE = 2  # ended with another exit code than 0: a failure, or a stop (start it again to resume)
NO_RUN = 3  # no run in the folder
STALLED_AFTER_S = 1800  # --stalled-after's default: longer than a checkpoint's save or an evaluation takes


def check(out: Path, stalled_after_s: float = STALLED_AFTER_S, now: float | None = None) -> tuple[int, str]:
    """The run in `out` as a probe sees it: (exit code, one line saying why). Training is alive while it steps (rank 0
    rewrites run/progress.json each step) or uploads (run/upload.json); the other phases while the controller's pulse
    (run/heartbeat, heartbeat.Pulse) or the events move. The newest start's events say which phase it is in."""
    from ..exitcodes import meanings

    status, run = of_folder(out), out / "run"
    if status.phase == "ended":
        if status.exit_code == 0:
            return HEALTHY, f"{out}: done ({status.ended_as}, exit code 0)"
        meaning = next((m for code, _, m in meanings() if code == status.exit_code), "")
        return ENDED_NOT_DONE, f"{out}: ended: {status.ended_as}, exit code {status.exit_code} ({meaning})"
    if status.phase == "unknown":
        return NO_RUN, f"{out}: no run here (no run/events.jsonl)"
    signs = [_mtime(run / EVENTS_FILE)]
    if status.phase == "training":  # the controller may live while the ranks hang: only their work counts
        signs += [p.updated for p in (Progress.load(run / PROGRESS_FILE), UploadProgress.load(run / UPLOAD_FILE)) if p]
    else:
        signs.append(_mtime(run / PULSE_FILE))
    age = (now or time.time()) - max(t for t in signs if t is not None)
    where = status.phase + (f", step {status.step} of {status.max_steps}" if status.step is not None else "")
    if age > stalled_after_s:
        what = "no step, upload or event" if status.phase == "training" else "no heartbeat or event"
        return STALLED, f"{out}: stalled: {where}; {what} for {age:.0f} s (more than {stalled_after_s:g} s)"
    return HEALTHY, f"{out}: {where}; last sign of life {age:.0f} s ago"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


TAKES = "status takes a job's output folder (SFT_OUTPUT_DIR) or its Hub repo (owner/name)"


def not_a_target(target: str) -> str | None:
    """Why `target`, not a folder here, is not a Hub repo either (None: it may be one): a file; a path written as
    one (./x, /x, ~/x, a name with no owner/); a data file's name; or a folder here with nothing of that name in it."""
    from ..settings import hub_name_problem
    from ..settings.entries import is_data_file

    local = Path(target).expanduser()
    if local.exists():
        return f"{target} is a file, not a job's output folder: {TAKES}"
    if "/" not in target or target.startswith((".", "/", "~")) or is_data_file(target) or local.parent.is_dir():
        return f"{target}: no such output folder here (a local path, not sent to the Hub): {TAKES}"
    why = hub_name_problem(target)
    return None if why is None else f"{target} is neither an output folder nor a Hub repo (owner/name): {why}"


def of_repo(repo_id: str, revision: str | None = None) -> Status:
    """The run as its Hub repo shows it: the newest checkpoint with a manifest and its step, the final model,
    the summary's end (the token from huggingface_hub's lookup, for a private repo)."""
    from huggingface_hub import HfApi

    from ..hub.layout import complete_prefix, final_done, hub_checkpoints

    api = HfApi()
    files = set(api.list_repo_files(repo_id, revision=revision))
    status = Status(repo_id + (f"@{revision}" if revision else ""), "unknown", final_model=final_done(files))
    complete = hub_checkpoints(files)[0]
    if complete:
        prefix = complete_prefix(files, complete[-1])
        status.checkpoint_on_hub = f"checkpoint-{complete[-1]}"
        state = _read(api, repo_id, f"{prefix}/trainer_state.json", revision) or {}
        status.phase, status.step, status.max_steps = "training", state.get("global_step"), state.get("max_steps")
    if "run/summary.json" in files:
        summary = Summary.from_dict(_read(api, repo_id, "run/summary.json", revision) or {})
        status.phase, status.ended_as, status.exit_code = "ended", summary.status, summary.exit_code
    return status


def _read(api, repo_id: str, path: str, revision: str | None) -> dict[str, Any] | None:
    try:
        return json.loads(Path(api.hf_hub_download(repo_id, path, revision=revision)).read_text())
    except (OSError, ValueError):
        return None


def _quiet_latest(out: Path) -> Path | None:
    """The newest complete checkpoint on disk, without the warnings a start prints about torn ones."""
    return next((c for c in reversed(checkpoints.all_checkpoints(out)) if checkpoints.problem(c) is None), None)


def _newer(known: str | None, name: str) -> str:
    step = int(name.split("-")[1])
    return name if known is None or step > int(known.split("-")[1]) else known


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{seconds:.0f} s" if seconds < 120 else f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else \
        f"{minutes} min"
