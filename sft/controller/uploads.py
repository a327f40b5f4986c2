"""The job's side of the Hub: connect at start, find where to resume, upload in the background, flush at the end.

The protocol itself (preflight, manifests, the uploader's schedule, retention, resume) is in sft/hub/.
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import checkpoints, exitcodes
from ..console import say
from ..handoff import Summary
from ..settings import Settings
from .output import Paths


def connect(s: Settings):
    """Check the token and the private repo before any GPU work; None when no repo is named (raises HubError)."""
    from ..hub import transport
    from ..hub.preflight import preflight

    if s.hub_repo is None:
        say("no SFT_HUB_REPO: checkpoints stay on this disk only (nothing is uploaded)")
        return None
    target = preflight(s.hub_repo, token(), revision=s.hub_revision)
    say(f"hub: uploading to {target.url} every {s.upload_minutes:g} min, {transport.describe()}")
    return target


def token() -> str | None:
    """The token the job uploads with: huggingface_hub's own lookup (HF_TOKEN, else the file at
    HF_TOKEN_PATH, else `hf auth login`'s), the one the start's check and the upload both read."""
    from huggingface_hub import get_token

    return get_token()


def already_done(target) -> bool:
    """The final model on the Hub: a second start has nothing to do (a finished run on disk is found before)."""
    from ..hub.resume import final_on_hub

    if target is not None and final_on_hub(target.api, target.repo_id, target.revision):
        say(f"the final model is already on {target.url}; nothing to do.")
        return True
    return False


def resume_point(paths: Paths, target) -> Path | None:
    """The newest complete checkpoint on disk; else, with a repo, the newest verified one on the Hub."""
    from ..hub.resume import resume_from_hub

    resume = checkpoints.latest_complete(paths.out)
    if resume is None and target is not None:
        resume = resume_from_hub(target.api, target.repo_id, paths.out, revision=target.revision)
    return resume


def start(s: Settings, target, paths: Paths, events=None, begin: bool = True):
    """The background uploader of checkpoints, or None without a repo. With begin=False, only made: its flush
    (finish, below) starts it for the newest checkpoint."""
    from ..hub.uploader import Uploader

    if target is None:
        return None
    uploader = Uploader(target, paths.out, interval_s=s.upload_minutes * 60, keep=s.save_total_limit, events=events)
    if begin:
        uploader.start()
    return uploader


def finish(uploader, code: int, paths: Paths, summary: Summary, grace_left_s: float) -> tuple[int, dict | None]:
    """Stopped or failed: flush the newest checkpoint in the grace left. Done: final model and reports (`summary`
    the one that goes up with them). The exit code, and what reached the Hub (None: not the final model)."""
    if code != exitcodes.DONE:
        if not uploader.flush(grace_left_s):
            say(f"warning: the newest checkpoint did not reach the Hub: {uploader.behind()}")
        uploader.stop(5)
        return code, None
    missing = uploader.finish(paths.final, paths.run, summary.to_dict())
    if missing:
        say("error: trained, but not uploaded: " + "; ".join(missing))
        return exitcodes.UPLOAD_INCOMPLETE, uploader.uploaded()
    return code, uploader.uploaded()


def grace_left(s: Settings, requested_at: float | None) -> float:
    """Seconds of SFT_STOP_GRACE_SECONDS left since the stop was asked for."""
    spent = time.monotonic() - (requested_at or time.monotonic())
    return max(s.stop_grace_seconds - spent, 0.0)
