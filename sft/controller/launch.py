"""Start the ranks through the real launcher (torchrun or deepspeed) and stop them gracefully.

The launcher runs in its own process session, so a signal meant for the job reaches this
controlling process first; the controller then asks the ranks to save and stop (a stop file every
rank polls each step), and only kills them when SFT_STOP_GRACE_SECONDS have passed.
"""

from __future__ import annotations

import fcntl
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn, Protocol

from .. import tracking
from ..console import say
from ..handoff import RunSpec
from ..lifeline import die_with_parent, leave
from ..nodes import Nodes, free_port
from ..planner.inputs import Ranks
from ..settings import Settings
from .silence import Silence

REPO_ROOT = Path(__file__).resolve().parents[2]
RANK_PROGRAM = "sft.ranks.train"  # what the launcher starts on every rank
AHEAD_PROGRAM = "sft.ranks.attention_ahead"  # FlashAttention-4's kernels, compiled while the ranks start
# After the grace period: SIGTERM to the launcher's group, then SIGKILL this many seconds later.
KILL_AFTER_SECONDS = 15


def command(s: Settings, ranks: Ranks, nodes: Nodes, port: int, module: str, *args: str) -> list[str]:
    """The launcher command line, as the seed writes it by hand, starting `module` with `args` on every rank;
    torchrun's static rendezvous across nodes."""
    if s.launcher == "deepspeed":
        # On CPU DeepSpeed's accelerator counts one device, so --include would refuse a second slot.
        where = ["--include", "localhost:" + ",".join(map(str, ranks.gpus))] if ranks.on_gpu else [
            "--num_gpus", str(ranks.count)]
        # The runner as a module of this interpreter: the venv's bin/ need not be on PATH.
        return [sys.executable, "-m", "deepspeed.launcher.runner", *where, "--master_port", str(port),
                "--module", module, *args]
    # --rdzv-conf timeout: how long node 0's agent waits for the other nodes' agents at each launch
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes.nnodes}",
            f"--node-rank={nodes.node_rank}", f"--nproc-per-node={ranks.count}", f"--master-addr={nodes.master_addr}",
            f"--master-port={port}", f"--rdzv-conf=timeout={s.node_timeout_seconds}", "-m", module, *args]


def spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The launcher, in its own session (signals reach the controller first) and dying with the controller
    (through the shim at the end of this file): a killed controller leaves no orphaned ranks. Its stdin is
    /dev/null: no library in a rank can ask a question there (transformers' "run the custom code? [y/N]")."""
    guarded = [sys.executable, "-m", __name__, str(os.getpid()), *cmd]
    return subprocess.Popen(guarded, cwd=REPO_ROOT, env=env, start_new_session=True, stdin=subprocess.DEVNULL)


def compile_cache(s: Settings) -> Path:
    """The compiled kernels (inductor's graphs, Triton's binaries, FlashAttention-4's) in the output folder, which
    outlives the container: a resumed or re-probed job loads them instead of compiling again."""
    return s.output_path.absolute() / "run" / "compile-cache"


def environment(s: Settings, ranks: Ranks, cache: Path | None = None) -> dict[str, str]:
    """The ranks' environment; `cache`: where they find compile_cache (the standby's link to it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # torchrun sets 1 when unset, which starves DeepSpeed's CPU Adam under offload: share the cores out.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks.count)))
    env[tracking.UNUSED_VARIABLE] = ",".join(tracking.unused(s.report_to, s.ds_config))  # hidden in the ranks
    cache = cache or compile_cache(s)
    if env.get("TORCHINDUCTOR_CACHE_DIR") in (None, _inductor_default()):  # unless the user pointed it elsewhere
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    env.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    # FlashAttention-4's CuTe kernels, compiled while the ranks start (compile_ahead) or at their first step; its
    # own persistent cache is off unless asked for.
    env.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    env.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(cache / "flash-attention"))
    if ranks.on_gpu and s.launcher == "torchrun":
        # torchrun numbers the visible GPUs from 0; the deepspeed launcher sets this itself from --include.
        env["CUDA_VISIBLE_DEVICES"] = _visible_devices(ranks.gpus)
    return env


def compile_ahead(spec: RunSpec | None, spec_path: Path, env: dict[str, str], ranks: Ranks) -> subprocess.Popen | None:
    """Where the ranks run FlashAttention-4 on GPUs (RunSpec.attention_lock): its kernels compiled meanwhile on
    the first rank's GPU (sft/ranks/attention_ahead.py), by a process that holds the lock until it ends."""
    if spec is None or not spec.attention_lock or not ranks.on_gpu:
        return None
    process = start_ahead([AHEAD_PROGRAM, str(spec_path)], Path(spec.attention_lock), env, ranks)
    if process is not None:
        say(f"FlashAttention-4's kernels: compiled meanwhile on GPU {ranks.gpus[0]} ({AHEAD_PROGRAM}); the ranks "
            "wait for them at their first attention call")
    return process


def start_ahead(program: list[str], lock: Path, env: dict[str, str], ranks: Ranks) -> subprocess.Popen | None:
    """`python -m PROGRAM...` on the first rank's GPU, holding `lock` until it ends. The lock is taken here, before
    the ranks start, so that no rank can find it free too early; the process inherits it. None where another
    process holds it (another node's, on a shared folder: the ranks wait for that one) or it cannot be taken."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        first = {**env, "CUDA_VISIBLE_DEVICES": _visible_devices(ranks.gpus[:1])}
        # its own session, as the launcher's: a Ctrl-C reaches the controller, which ends it with the launch
        return subprocess.Popen([sys.executable, "-m", *program], cwd=REPO_ROOT, env=first,
                                stdin=subprocess.DEVNULL, pass_fds=(fd,), start_new_session=True)
    except OSError as e:  # the ranks compile the kernels at their first step, as without this
        say(f"FlashAttention-4's kernels are not compiled ahead: {e}")
        return None
    finally:
        os.close(fd)  # the process holds the lock now, or nobody does


def _inductor_default() -> str:
    """Inductor's own cache folder, which it writes into this process's environment the first time anything
    asks for its cache (torch._inductor.runtime.cache_dir_utils.cache_dir): found there, it is not the user's."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()


def _visible_devices(gpus: tuple[int, ...]) -> str:
    # SFT_GPUS indexes the GPUs this container sees, which CUDA_VISIBLE_DEVICES may already narrow.
    outer = os.environ.get("CUDA_VISIBLE_DEVICES")
    if outer:
        names = outer.split(",")
        return ",".join(names[g] for g in gpus)
    return ",".join(map(str, gpus))


class Waiting(Protocol):
    """Ranks started before the decision, waiting for a spec (standby.py): a launch takes them over."""

    cmd: list[str]

    def hand_over(self, spec_path: Path, spec: RunSpec | None, env: dict[str, str]
                  ) -> tuple[subprocess.Popen, subprocess.Popen | None]:
        """They run `spec_path` from now: (the launcher's process, FlashAttention-4's process if one runs)."""


class Launch:
    """One run of the ranks; `stop()` asks them to save and stop, then enforces the grace period."""

    def __init__(self, s: Settings, ranks: Ranks, spec_path: Path, stop_file: Path, nodes: Nodes = Nodes(),
                 standby: Waiting | None = None):
        self.settings, self.ranks, self.stop_file, self.spec_path = s, ranks, stop_file, spec_path
        self.standby = standby  # ranks started before the decision, which this launch takes over
        self.cmd = standby.cmd if standby else command(s, ranks, nodes, nodes.master_port or free_port(),
                                                       RANK_PROGRAM, str(spec_path))
        self.nodes = nodes
        self.deadline: float | None = None
        self.proc: subprocess.Popen | None = None
        self.ahead: subprocess.Popen | None = None
        self.silence: Silence | None = None  # node 0's training launch: a long silence of its ranks said

    def run(self) -> int:
        """Run to the end; return the launcher's exit code."""
        self.start()
        return self.wait()

    def start(self) -> None:
        env, spec = environment(self.settings, self.ranks), RunSpec.load(self.spec_path)
        say("$ " + " ".join(self.cmd))  # the standby's command where it runs this launch
        if self.standby is not None:
            self.proc, self.ahead = self.standby.hand_over(self.spec_path, spec, env)
        else:
            self.ahead = compile_ahead(spec, self.spec_path, env, self.ranks)
            self.proc = spawn(self.cmd, env)
        if spec.mode == "train" and spec.run_dir and self.nodes.leads:  # rank 0 writes its progress there
            self.silence = Silence(Path(spec.run_dir), self.proc.pid)

    def wait(self, seconds: float | None = None) -> int | None:
        """The launcher's exit code once it ends; None if it still runs after `seconds` (None: wait to the end).
        The grace period of a stop is enforced meanwhile."""
        assert self.proc is not None, "start() first"
        until = None if seconds is None else time.monotonic() + seconds
        while True:
            try:
                code = self.proc.wait(timeout=1 if until is None else max(0.0, min(1.0, until - time.monotonic())))
                self._end_ahead()
                return code
            except subprocess.TimeoutExpired:
                self._enforce_deadline()
                if self.silence is not None:
                    self.silence.look()
                if until is not None and time.monotonic() >= until:
                    return None

    def _end_ahead(self) -> None:
        """The kernels' process ends with the ranks, whatever it still does (it has long finished, normally)."""
        if self.ahead is None:
            return
        if self.ahead.poll() is None:
            self.ahead.kill()
        self.ahead.wait()

    def stop(self) -> None:
        if self.deadline is not None:
            return
        self.stop_file.parent.mkdir(parents=True, exist_ok=True)
        self.stop_file.touch()
        self.deadline = time.monotonic() + self.settings.stop_grace_seconds
        say(f"stop requested: the ranks save a checkpoint and stop "
              f"(SFT_STOP_GRACE_SECONDS={self.settings.stop_grace_seconds})")

    def _enforce_deadline(self) -> None:
        if self.deadline is None or time.monotonic() < self.deadline or self.proc is None:
            return
        say("grace period over: stopping the ranks")
        _signal_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout=KILL_AFTER_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc, signal.SIGKILL)
        self.deadline = float("inf")


class Stopper:
    """SIGTERM/SIGINT in the controller, or the time limit: forward a stop to the ranks running now, remember
    when and why."""

    def __init__(self):
        self.requested_at: float | None = None
        self.reason: str | None = None  # "SIGTERM", "SIGINT", "time limit"
        self.launch: Launch | None = None
        self.on_request = None  # called once with (reason, detail): the event log

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame) -> None:
        say(f"received {signal.Signals(signum).name}")
        self.request(signal.Signals(signum).name)

    def request(self, reason: str, detail: str = "") -> None:
        """Stop: the ranks running now save and stop, and any later launch stops at its first step."""
        if self.requested_at is None:
            self.requested_at, self.reason = time.monotonic(), reason
            if self.on_request is not None:
                self.on_request(reason, detail)
        if self.launch is not None:
            self.launch.stop()

    def running(self, launch: Launch) -> int:
        """Run `launch` to its end, stopping it if a stop was asked before or while it runs."""
        self.started(launch)
        try:
            return launch.wait()  # type: ignore[return-value]
        finally:
            self.launch = None

    def started(self, launch: Launch) -> None:
        """Start `launch`; a stop asked before or while it runs stops it (until `launch` is cleared)."""
        self.launch = launch
        launch.start()
        if self.requested:
            launch.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run_launcher(cmd: list[str]) -> NoReturn:
    """The launcher in this process: `python -m MODULE ARGS` (this interpreter's, as command() writes it) run as that
    command would run it, then, where it ends with an exit code, left without the interpreter's teardown
    (lifeline.leave): the controller waits for this process after the ranks have ended, and the teardown of its
    torch only delays the job's end. An exception it raises ends it as Python ends it (its traceback, exit 1); any
    other command is exec'd."""
    if cmd[:2] != [sys.executable, "-m"] or len(cmd) < 3:
        os.execvp(cmd[0], cmd)
    sys.argv = cmd[2:]  # argv[0] becomes the module's file, as under `python -m`
    try:
        runpy.run_module(cmd[2], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            raise  # a message rather than a code: Python's own exit prints it
        leave(e.code or 0)
    leave(0)


if __name__ == "__main__":
    # python -m sft.controller.launch PARENT_PID CMD...: the launcher, bound to the controller's life.
    die_with_parent(int(sys.argv[1]))
    run_launcher(sys.argv[2:])
