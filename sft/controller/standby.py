"""The ranks, started before the decision: they import their libraries while the controller checks the settings'
inputs, reads the data and decides, then run the first launch's spec.

The entrypoint starts the standby once the settings themselves are valid (`start`): the launcher with its ranks
and, where FlashAttention-4 may run, the process that compiles its kernels ahead, each in sft/ranks/standby.py,
waiting for a Start in this standby's private folder. The job's first launch takes them over (`hand_over`, from
launch.Launch): the spec is written where they wait, and they run it as a launch started then would. A job that
ends before, or whose ranks are not these, ends them (`end`): they printed and wrote nothing.

Why: a rank's imports take seconds, and came after the controller's checking, reading and deciding, which took
longer still (measured: docs/speed.md, 'the ranks start with the job'); started with the job, they are off the
path to the first step. Written by hand: neither torchrun nor the deepspeed launcher starts ranks before their
program's arguments are known.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..console import say
from ..handoff import RunSpec, StandbyFolder, Start, write_json
from ..nodes import Nodes, free_port
from ..planner.inputs import GPU, Ranks
from ..settings import Settings
from . import launch, machine

PROGRAM = "sft.ranks.standby"
FOLDER_PREFIX = "sft-standby-"
ABANDONED_AFTER_SECONDS = 60  # a folder younger than this may be a starting controller's, its lock not yet taken


class Standby:
    """The launcher and its ranks (and FlashAttention-4's process), started and waiting for a spec."""

    def __init__(self, s: Settings, ranks: Ranks, nodes: Nodes = Nodes(), kernels_ahead: bool = False):
        """`kernels_ahead`: FlashAttention-4's process too (where the decision may choose it)."""
        self.ranks, self.began, self.taken = ranks, time.monotonic(), False
        remove_abandoned(Path(tempfile.gettempdir()))
        self.folder = StandbyFolder(Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX)))
        self.alive, self.ahead, self.proc = -1, None, None
        self.compile_cache = launch.compile_cache(s)
        self.cmd = launch.command(s, ranks, nodes, nodes.master_port or free_port(), PROGRAM,
                                  launch.RANK_PROGRAM, str(self.folder.ranks))
        try:
            # Held while this process lives: a process whose controller died (even before it could set its own
            # death signal, its launcher killed as it started) sees the lock free and ends (ranks/standby.py::wait).
            self.alive = os.open(self.folder.controller, os.O_WRONLY | os.O_CREAT, 0o644)
            fcntl.flock(self.alive, fcntl.LOCK_EX)
            # The libraries make their caches' folders at import (torch._dynamo's, FlashAttention-4's) and keep their
            # paths: they find the output folder's compile cache through a link, which points into this folder until
            # the hand-over (nothing is written in the output folder before the job holds its lock).
            self.folder.cache_before_start.mkdir()
            self.folder.cache.symlink_to(self.folder.cache_before_start)
            env = launch.environment(s, ranks, self.folder.cache)
            if kernels_ahead:
                self.ahead = launch.start_ahead([PROGRAM, launch.AHEAD_PROGRAM, str(self.folder.ahead)],
                                                self.folder.lock, env, ranks)
            self.proc = launch.spawn(self.cmd, env)
        except OSError:
            self.end()
            raise

    def fits(self, ranks: Ranks) -> bool:
        """Whether these ranks can run a launch of `ranks`: the same ones, still waiting."""
        return not self.taken and ranks == self.ranks and self.proc is not None and self.proc.poll() is None

    def spec(self, spec: RunSpec) -> RunSpec:
        """The spec as these ranks run it: FlashAttention-4's lock is the one this standby's process holds."""
        return replace(spec, attention_lock=str(self.folder.lock)) if spec.attention_lock and self.ahead else spec

    def hand_over(self, spec_path: Path, spec: RunSpec | None, env: dict[str, str]
                  ) -> tuple[subprocess.Popen, subprocess.Popen | None]:
        """The ranks run `spec_path` from now: (the launcher's process, FlashAttention-4's process if one runs)."""
        self.taken = True
        self.compile_cache.mkdir(parents=True, exist_ok=True)
        link = self.folder.path / ".compile-cache.new"
        link.symlink_to(self.compile_cache)
        link.replace(self.folder.cache)  # at once, for every process: the output folder's cache from now
        ahead = self.ahead if spec is not None and spec.attention_lock == str(self.folder.lock) else None
        if ahead is not None:
            write_json(self.folder.ahead, Start(spec=str(spec_path)).to_dict())
        else:  # FlashAttention-4's process waits for none of this spec's kernels; one is started now if needed
            _kill(self.ahead)
            ahead = launch.compile_ahead(spec, spec_path, env, self.ranks)
        write_json(self.folder.ranks, Start(spec=str(spec_path)).to_dict())
        say(f"standby: the ranks above started {time.monotonic() - self.began:.1f} s ago, before the decision, "
            f"and run {spec_path} from now")
        assert self.proc is not None, "fits() first"
        return self.proc, ahead

    def end(self) -> None:
        """The standby's processes end, unless a launch took them over; its folder goes with the job."""
        if not self.taken:
            _kill(self.proc)  # mid-import or waiting: nothing to save, nothing written
            _kill(self.ahead)
            self.taken = True
        shutil.rmtree(self.folder.path, ignore_errors=True)
        if self.alive >= 0:
            os.close(self.alive)
            self.alive = -1


def start(s: Settings, ranks: Ranks, nodes: Nodes, gpus: tuple[GPU, ...]) -> Standby | None:
    """A standby for a job of these settings on one node; None on several (each node's ranks start when node 0
    says), or where its processes could not start (the job starts its ranks after deciding)."""
    if nodes.nnodes > 1:
        return None
    try:
        return Standby(s, ranks, nodes, ranks.on_gpu and machine.flash_attention_4_may_run(gpus, s.attention))
    except OSError:
        return None


def remove_abandoned(tmp: Path) -> None:
    """The folders of standbys whose controller was killed (SIGKILL leaves it no time to remove its folder; its
    processes died with it): no live process holds their controller's lock. A live job's folder, whose ranks find
    their compile cache through it, is locked until the job ends."""
    for path in tmp.glob(FOLDER_PREFIX + "*"):
        try:
            old = time.time() - path.stat().st_mtime > ABANDONED_AFTER_SECONDS
        except OSError:  # removed meanwhile
            continue
        if old and not StandbyFolder(path).waits():
            shutil.rmtree(path, ignore_errors=True)


def _kill(process: subprocess.Popen | None) -> None:
    """A standby's process and its session (the launcher's ranks follow it: they die with their parent)."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()

