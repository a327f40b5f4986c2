"""One job per output folder: a lock on OUTPUT/run/job.lock that node 0's controller holds while it runs.

The lock is flock(2), which the kernel releases when its holder dies, however it dies (kill -9, a lost
VM): a crashed job cannot leave it stuck, and no pid or clock is guessed at. The file also says who
holds it, for the message a second job prints; a holder that ended without clearing it died, and the
next start says it takes the folder over. On NFS, Linux carries flock as a POSIX lock to the server,
so a job on another node sees it too (NFSv4 frees a dead node's lock when its lease runs out, 90 s by
default); a filesystem that cannot lock is said so, and the job runs unguarded.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

NAME = "job.lock"  # under OUTPUT/run/


class Busy(Exception):
    """Another job holds the folder (the message names it and what to do)."""


class Lock:
    """The held lock; `release` clears the holder's note, so the next start knows this one ended cleanly."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass  # a full disk cannot stop the release: the note stays, the lock goes with the descriptor
        os.close(self.fd)  # closing it releases the lock
        self.fd = None

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"


def take(out: Path) -> Lock:
    """Hold the output folder's lock, or raise Busy at once when another job holds it."""
    path = Path(out) / "run" / NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the ranks (Python's default)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        note = _note(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise Busy(f"another job is running on {out} ({note or 'holder unknown'}; it holds {path}): wait for "
                       "it to end, stop it, or give this one another SFT_OUTPUT_DIR") from None
        print(f"warning: cannot lock {path} ({e.strerror}): this filesystem does not lock files, so nothing stops "
              "a second job on this folder", flush=True)
        return Lock(path, None)
    left = _note(fd)
    if left:
        print(f"warning: the job that held {out} ({left}) ended without releasing it (killed, or its machine "
              "died); its lock died with it, so this start takes the folder over", flush=True)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder() + "\n").encode(), 0)
    except OSError:
        pass  # the note is for people; the lock holds without it (a full disk)
    return Lock(path, fd)


def _note(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        return ""
