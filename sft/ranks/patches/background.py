"""Checkpoint files written while the steps go on: each storage copied into host memory kept for it (the snapshot),
then written from a thread of its own.

Why by hand: DeepSpeed's DecoupledCheckpointEngine hands the live tensors to a process that writes them through its
FastFileWriter (the async_io op: libaio and O_DIRECT, which a tmpfs refuses), and it commits before the next
optimizer step, so a write longer than one step's forward and backward still holds the steps. torch's asynchronous
checkpointing (torch.distributed.checkpoint.async_save) writes its own format, which neither DeepSpeed's load nor
the Trainer's resume reads. Here each file is the one torch.save writes (saving.py), copied out in about a second
and written while the next steps run.

A file takes its place only once whole: it is written into a .sft-writing-RANK folder beside it and moved at the end, so a
checkpoint with such a file in it is not complete (sft/checkpoints.py): the uploader waits for it and a resume never picks it,
and a killed process leaves a checkpoint that is plainly torn. One checkpoint is written at a time: a new save, the
end of training and a stop wait for the one in flight (`wait`), and a write's failure (a full disk) is raised in the
training's own thread at the next step (`check`), as the synchronous save raised it.

The host memory is one checkpoint's size on this rank, taken in blocks of BLOCK_BYTES at the first save and kept
(pinned where a GPU is there: a copy from pageable memory runs at a fraction of the speed); the planner counts it
(planner/memory.py `snapshot_bytes`) and the preflight checks it against the host's memory.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...checkpoints import WRITING, being_removed, remove_retired

BLOCK_BYTES = 1 << 30  # the snapshot's blocks: a power of two, as torch's pinned allocator rounds each up to one
WRITERS = 4  # pwrite calls at once (saving.py)
CLEAR_WAIT_S = 600.0  # a rank that does not remove the retired checkpoints waits at most this long for them to go


@dataclass
class Written:
    """One checkpoint folder's files written by this rank."""

    folder: str
    seconds: float = 0.0  # from its first file's snapshot to its last file's rename
    bytes: int = 0
    files: int = 0
    sealed: bool = False  # its save returned: no more files come for it
    began: float = field(default_factory=time.monotonic)


class Arena:
    """The snapshot's host memory: blocks taken as the first checkpoint needs them, reused by the next ones."""

    def __init__(self, pinned: bool):
        self.pinned, self.blocks, self.used = pinned, [], []
        self._lock = threading.Lock()  # a reservation made ahead, in a thread of its own (reserve)

    def reset(self) -> None:
        with self._lock:
            self.used = [0] * len(self.blocks)

    def reserve(self, nbytes: int) -> None:
        """Take blocks for `nbytes` now, so the first checkpoint does not wait for pinning them (about 3 GB/s)."""
        with self._lock:
            while sum(b.numel() for b in self.blocks) < nbytes:
                self.blocks.append(torch.empty(BLOCK_BYTES, dtype=torch.uint8, pin_memory=self.pinned))
                self.used.append(0)

    def take(self, nbytes: int) -> list[torch.Tensor]:
        """Pieces of host memory that hold `nbytes` together, in order (a storage may span blocks)."""
        with self._lock:
            return self._take(nbytes)

    def _take(self, nbytes: int) -> list[torch.Tensor]:
        pieces = []
        for i, block in enumerate(self.blocks):
            if nbytes == 0:
                break
            room = block.numel() - self.used[i]
            if room > 0:
                size = min(room, nbytes)
                pieces.append(block[self.used[i]:self.used[i] + size])
                self.used[i] += size
                nbytes -= size
        while nbytes > 0:  # a small model's snapshot takes a small block: the next power of two, from 64 MiB
            size = min(BLOCK_BYTES, max(1 << 26, 1 << (nbytes - 1).bit_length()))
            self.blocks.append(torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned))
            self.used.append(min(size, nbytes))
            pieces.append(self.blocks[-1][:min(size, nbytes)])
            nbytes -= min(size, nbytes)
        return pieces

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(b.numel() for b in self.blocks)


@dataclass
class _File:
    temporary: str
    final: str
    pieces: list  # (host tensor, offset in the file)
    copied: object  # a CUDA event the copies were recorded on, or None
    nbytes: int
    folder: Written


@dataclass
class _Clear:
    output_dir: Path
    remover: bool  # this rank removes the retired checkpoints; the others wait until they are gone


class Writer:
    """The one thread that writes snapshots to their files, in the order they were taken."""

    def __init__(self):
        self.arena = Arena(pinned=torch.cuda.is_available())
        self._queue: queue.Queue[_File | _Clear] = queue.Queue()
        self._lock = threading.Condition()  # guards what follows, shared with the writing thread
        self._pending = 0  # jobs queued and not done: files and clears
        self._files = 0  # of them, files
        self._failure: BaseException | None = None
        self._current: Written | None = None  # the checkpoint whose files are being taken or written
        self._done: list[Written] = []
        self._made: set[str] = set()  # this rank's writing folders, removed once empty (wait)
        self.slower_s = 0.0  # each file waits this long before its bytes are written (the tests' slow disk: sft/dev/faults.py)
        threading.Thread(target=self._run, name="checkpoint-background", daemon=True).start()

    def skeleton(self, final: str) -> str:
        """Where `final` is written until whole: a folder of this rank's beside it (the ranks write into one
        checkpoint folder at once, and a folder shared by them could be removed under another rank's new file)."""
        folder = os.path.join(os.path.dirname(final), f"{WRITING}-{os.environ.get('RANK', '0')}")
        os.makedirs(folder, exist_ok=True)
        self._made.add(folder)
        return os.path.join(folder, os.path.basename(final))

    def snapshot(self, sources: list[torch.Tensor], offsets: list[int], temporary: str, final: str) -> None:
        """Copy the sources (each a tensor's bytes: 1-D uint8) into the arena, GPU copies queued on a side stream
        that the training's stream then waits for (no step changes them first), and queue their file for writing
        at `offsets` in `temporary` (made already, of its final size), which then moves to `final`."""
        parent = Path(final).parent  # checkpoint-N/global_stepN/FILE, or checkpoint-N/FILE
        folder = str(parent if parent.name.startswith("checkpoint-") else parent.parent)
        if self._current is None or self._current.folder != folder:
            self.wait(files_only=True)  # a new checkpoint: the one in flight first, its memory then serves this one
            with self._lock:
                self._current = Written(folder)
        pieces, nbytes = [], 0
        on_gpu = [s.device for s in sources if s.device.type == "cuda"]
        stream = torch.cuda.Stream(on_gpu[0]) if on_gpu else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(on_gpu[0]))
        for data, offset in zip(sources, offsets):
            start, gpu = 0, data.device.type == "cuda"
            for piece in self.arena.take(data.numel()):
                with torch.cuda.stream(stream) if gpu else contextlib.nullcontext():
                    piece.copy_(data[start:start + piece.numel()], non_blocking=gpu)
                pieces.append((piece, offset + start))
                start += piece.numel()
            nbytes += data.numel()
        copied = None
        if stream is not None:
            copied = torch.cuda.Event()
            copied.record(stream)
            torch.cuda.current_stream(on_gpu[0]).wait_stream(stream)
        with self._lock:
            self._pending += 1
            self._files += 1
        self._queue.put(_File(temporary, final, pieces, copied, nbytes, self._current))

    def clear(self, output_dir: Path, remover: bool) -> None:
        """Before the next checkpoint's files: the retired checkpoints (checkpoints.retire) removed by this rank, or,
        where another rank removes them, gone, so that the disk never holds them beside the new one; the training
        goes on meanwhile."""
        with self._lock:
            self._pending += 1
        self._queue.put(_Clear(output_dir, remover))

    @staticmethod
    def _clear(job: _Clear) -> None:
        if job.remover:
            remove_retired(job.output_dir)
            return
        deadline = time.monotonic() + CLEAR_WAIT_S
        while being_removed(job.output_dir) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _run(self) -> None:
        with ThreadPoolExecutor(WRITERS, thread_name_prefix="checkpoint-write") as writers:
            while True:
                job = self._queue.get()
                try:
                    if isinstance(job, _Clear):
                        self._clear(job)
                    elif self._failure is None:
                        self._write(job, writers)
                    else:  # after a failed write the checkpoint is torn anyway: its other files go too
                        Path(job.temporary).unlink(missing_ok=True)
                except BaseException as error:  # a full disk, a folder gone: raised in the training's thread
                    self._failure = error
                    if isinstance(job, _File):
                        Path(job.temporary).unlink(missing_ok=True)  # what it wrote goes, so the disk has its room back
                finally:
                    with self._lock:
                        self._pending -= 1
                        self._files -= isinstance(job, _File)
                        self._settle()
                        self._lock.notify_all()

    def _write(self, job: _File, writers: ThreadPoolExecutor) -> None:
        from .saving import _pwrite

        if job.copied is not None:
            job.copied.synchronize()
        time.sleep(self.slower_s)
        fd = os.open(job.temporary, os.O_WRONLY)
        try:
            for future in [writers.submit(_pwrite, fd, piece, offset) for piece, offset in job.pieces]:
                future.result()
        finally:
            os.close(fd)
        os.replace(job.temporary, job.final)
        with self._lock:
            done = job.folder
            done.bytes, done.files = done.bytes + job.nbytes, done.files + 1
            done.seconds = round(time.monotonic() - done.began, 2)

    def _settle(self) -> None:
        """Under the lock: a sealed checkpoint with nothing left to write is written."""
        if self._files == 0 and self._current is not None and self._current.sealed:
            self._done.append(self._current)
            self._current = None

    def seal(self) -> None:
        """The checkpoint's save returned: once its files are written, `written` tells of it."""
        with self._lock:
            if self._current is not None:
                self._current.sealed = True
                self._settle()

    def wait(self, files_only: bool = False) -> None:
        """Until every queued file is written (and, but with files_only, every clear done); then the arena is free
        for the next checkpoint. Raises a write's failure."""
        with self._lock:
            while self._files if files_only else self._pending:
                self._lock.wait()
            if self._current is not None:
                self._current.sealed = True
                self._settle()
        for folder in list(self._made):  # removed once empty: nothing of this rank's is left in them
            with contextlib.suppress(OSError):
                os.rmdir(folder)
                self._made.discard(folder)
        self.arena.reset()
        self.check()

    def check(self) -> None:
        """Raise the failure of a write, once."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def written(self) -> list[Written]:
        """The checkpoints whose files were all written since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done


_writer: Writer | None = None


def start(reserve_bytes: int = 0) -> Writer:
    """The writer of this process, from now on (patches.apply: where the run writes checkpoints in the background),
    its memory for `reserve_bytes` taken in a thread of its own meanwhile."""
    global _writer
    if _writer is None:
        _writer = Writer()
        if reserve_bytes > 0:
            threading.Thread(target=_writer.arena.reserve, args=(reserve_bytes,), name="checkpoint-reserve",
                             daemon=True).start()
    return _writer


def removal_behind(output_dir: Path, remover: bool) -> None:
    """At a finished run's end, where the ranks wait for nothing else: the retired checkpoints' removal (in this
    rank's writer thread, which ends with the rank) handed to a process of its own, so that it goes on while the
    ranks, the launcher and the controller end, instead of holding every rank until the last file is gone. `rm`, in
    its own session: the launcher ends the ranks' groups, not it. The controller removes what is left before the job
    exits (controller/training.py), and any start removes what a kill left (Paths.clear_leftovers)."""
    if not remover or not (folders := being_removed(output_dir)):
        return
    try:
        subprocess.Popen(["rm", "-rf", "--", *map(str, folders)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:  # no rm here: the controller removes them all
        pass


def writer() -> Writer | None:
    """The writer, where this run writes its checkpoints in the background; None where it writes them at once."""
    return _writer
