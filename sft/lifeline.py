"""The job's processes die together: a rank or a launcher whose parent died must not train on alone."""

from __future__ import annotations

import os
import signal


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG).

    Written by hand: neither torchrun nor the deepspeed launcher ties its ranks' lives to whoever
    started it, and subprocess's preexec_fn is unsafe in the controller (the uploader thread runs there).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG; kept across exec
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # the parent died before the request took effect
