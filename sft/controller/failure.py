"""Why a training failed, said after it, from what can still be seen when the failure took the ranks' words with
it: a disk that filled (the rank's own report could not be written on it either), a folder that became read-only,
a report that is missing. The job's exit code stays the training's (6); these lines say why and what to do.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .. import checkpoints
from ..console import say
from ..planner import disk

READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def after(out: Path, predicted_checkpoint_bytes: int | None = None, error: str | None = None) -> None:
    """After a failed training: say so when the disk is full or the folder cannot be written, and remove the
    checkpoints the failure tore (a resume never trusts them; gone, they give the summary room). A disk is full
    where it has less room than one checkpoint: the newest complete one's as measured, else the plan's size."""
    newest = checkpoints.latest_complete(out)
    measured = checkpoints.folder_bytes(newest) if newest else None
    size, free = measured or predicted_checkpoint_bytes, checkpoints.free_disk(str(out))
    refused = unwritable(out)
    if refused is not None and refused.errno in READ_ONLY:
        say(f"error: {out} cannot be written any more ({refused.strerror}), so the save failed: make it writable "
            "(remount it read-write, or fix its permissions), then start again: it resumes from the newest complete "
            "checkpoint")
    elif disk.full_after_failure(free, size) or (refused is not None and refused.errno == errno.ENOSPC) or \
            "No space left on device" in (error or ""):
        one = (f", less than one checkpoint: {size / 1e9:.3g} GB" + ("" if measured else " as planned")) if size else ""
        say(f"error: the disk of {out} is full ({free / 1e9:.3g} GB free{one}), so the save failed: free space or "
            "mount a larger volume")
    resumes = newest.name if newest else "the beginning"
    checkpoints.remove_retired(out)  # retired before the failure, their removal cut off
    for torn in checkpoints.torn(out):
        shutil.rmtree(torn, ignore_errors=True)
        if torn.exists():  # a read-only folder: it stays, and a resume skips it as incomplete
            say(f"{torn.name} is incomplete and could not be removed; a new start skips it and resumes from {resumes}")
        else:
            say(f"removed {torn.name}: the failure left it incomplete; a new start resumes from {resumes}")


def unwritable(folder: Path) -> OSError | None:
    """Why a file cannot be made in the folder now (None: it can): the one sure test of a read-only mount, of
    permissions, and of a disk that holds not one more file."""
    probe = folder / f".sft-write-check-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as e:
        return e
    return None


def no_report(code: int) -> str:
    """The failure's words where rank 0 left no report (it could not write it, or it was killed)."""
    return ": rank 0 wrote no report; the ranks' own lines above say what they met" if code else ""
