"""The job's processes die together (a rank or a launcher whose parent died must not train on alone), and leave
without the interpreter's teardown once their work is done."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import NoReturn


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


def leave(code: int) -> NoReturn:
    """Exit with `code` as Python's own exit would, less its teardown: what the interpreter waits for at exit is
    waited for (its non-daemon threads, threading's exit calls such as an executor's shutdown, then every atexit
    handler: a temporary folder's removal, logging's flush), stdout and stderr are flushed, and the process ends.
    The teardown skipped frees every module and object one by one, which with torch and its libraries loaded takes
    longer than all the job's end besides, for nothing: the kernel frees the memory and closes the files (a file
    object still open would lose what it buffered: the job's own files are closed once written). From the main
    thread; elsewhere, for a code that is not a number, or where this Python lacks the hooks: the ordinary exit."""
    shutdown = getattr(threading, "_shutdown", None)  # what Py_Finalize calls first (CPython 3.8 and later)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if (shutdown is None or run_exit_handlers is None or not isinstance(code, int)
            or threading.current_thread() is not threading.main_thread()):
        sys.exit(code)
    shutdown()
    run_exit_handlers()  # a handler's error is printed there, never raised: the exit code stands
    for stream in (sys.stdout, sys.stderr):
        try:  # (None where the process has no such stream)
            stream.flush()
        except (AttributeError, OSError, ValueError):  # none, closed or broken: nothing more can be said there
            pass
    os._exit(code)
