"""The lock files that a killed build of a torch extension left behind: found at start, removed before any rank starts.

DeepSpeed builds its ops on first use through torch.utils.cpp_extension (on CPU ranks the shared-memory all-reduce
at every start, CPU Adam where it is not prebuilt). Every load, built or not, takes the build folder's `lock`: a file
made with O_CREAT|O_EXCL and removed when the load ends. A process killed meanwhile (kill -9, the OOM killer, a
launcher's end taking its ranks with it) leaves the file, and every later load waits for it forever, silent: a
job that hangs after its ranks start, with nothing in its log (pytorch/pytorch#189245; torch 2.13 still waits
forever). Seen here as a CI run whose demo hung for 89 minutes.

Why by hand: neither torch nor DeepSpeed recovers from it. A lock is stale when no process has it open: its maker
holds the descriptor from the O_EXCL create until it removes the file, and no one opens an existing lock (a waiter
only looks for the file). So a lock that no process of its owner holds can only have been left by a dead one, and
it cannot come alive again: it is removed. A lock whose owner's processes cannot all be read is left as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCK = "lock"  # torch.utils.cpp_extension's name for it, in each extension's build folder


def extensions_root() -> Path:
    """The folder torch builds extensions in (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/py311_cpu and
    the like), as the ranks will find it; made if missing."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("cpu_adam", verbose=False)).parent  # the folder CPU Adam's check makes anyway


def stale(root: Path | None = None) -> tuple[str, ...]:
    """The build locks under `root` that no process holds: each one a load would wait on forever."""
    root = extensions_root() if root is None else root
    locks = {}
    for path in root.glob(f"*/{LOCK}"):
        try:
            st = path.stat()
        except OSError:  # released meanwhile
            continue
        locks[(st.st_dev, st.st_ino)] = (str(path), st.st_uid)
    if not locks:
        return ()
    held, unread = _held_open(set(locks))
    return tuple(sorted(path for key, (path, uid) in locks.items() if key not in held and uid not in unread))


def remove(found: tuple[str, ...]) -> list[str]:
    """Of the locks `stale` found (all in one root), those still there and still held by no one, removed; the ones
    removed."""
    if not found:
        return []
    still = set(stale(Path(found[0]).parent.parent))  # one look at /proc for them all
    removed = [path for path in found if path in still]
    for path in removed:
        Path(path).unlink(missing_ok=True)
    return removed


def _held_open(files: set[tuple[int, int]]) -> tuple[set[tuple[int, int]], set[int]]:
    """Of `files` (device, inode), those some process has open; and the users some of whose processes' open files
    could not be read (another user's, without root)."""
    held: set[tuple[int, int]] = set()
    unread: set[int] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = list(os.scandir(f"/proc/{pid}/fd"))
        except PermissionError:
            try:
                unread.add(os.stat(f"/proc/{pid}").st_uid)
            except OSError:
                pass
            continue
        except OSError:  # the process ended
            continue
        for fd in fds:
            try:
                st = os.stat(fd.path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in files:
                held.add((st.st_dev, st.st_ino))
    return held, unread
