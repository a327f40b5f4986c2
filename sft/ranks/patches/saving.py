"""torch.save's checkpoint file, written without torch's copy of each GPU storage into fresh host memory.

Why by hand: torch.save copies each GPU storage whole into new pageable memory (`storage.cpu()`) and then writes it from
one thread. That copy was most of a ZeRO-2 checkpoint's save, and a Qwen3-4B checkpoint took as long as well over a
hundred steps (measured: docs/speed.md, 'where a checkpoint's save goes'). torch's own switch
(`use_pinned_memory_for_d2h`) pins one block per storage, rounded up to a power of two, and its caching allocator keeps
them for the rest of the run, as much host memory as the largest partitions. DeepSpeed's FastFileWriter needs its
async_io op (libaio) and O_DIRECT, which a tmpfs refuses.

How: torch.save under `torch.serialization.skip_data` writes the whole file at once, each storage's record left as
a hole of its size (a sparse file); the storages are then written into their records with `os.pwrite`, by a few
threads at once: host storages from their memory, GPU storages through a ring of small pinned chunks, copied on
a stream of their own. The file is the one torch.save writes, read back by torch.load as before. torch calls
skip_data a prototype: where it refuses an object, or the file's records do not match the storages found here,
torch.save writes the file as it always did.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch


log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 20  # one GPU-to-host copy
CHUNKS = 8  # the pinned ring: 512 MiB of host memory, pinned at the first save from a GPU and kept for the next
WRITERS = 4  # pwrite calls at once; a tmpfs or an NVMe disk takes them in parallel


def save(obj, path: str | os.PathLike, writer=None) -> bool:
    """Write `obj` to `path` as torch.save does. True where written by records; False where torch.save wrote it.
    With a `writer` (background.Writer), the storages are copied out and written while the steps go on: the file
    takes its name once whole."""
    path = os.fspath(path)
    skeleton = writer.skeleton(path) if writer is not None else path
    try:
        storages = _storages(obj)
        if any(s.device.type not in ("cpu", "cuda") for s in storages):
            raise ValueError("a storage on neither the host nor a CUDA device")
        with torch.serialization.skip_data():
            torch.save(obj, skeleton)
        offsets = _record_offsets(skeleton, storages)
    except (RuntimeError, ValueError, TypeError, pickle.PicklingError) as error:  # skip_data refuses, or the
        # records do not match: torch.save writes it (and raises what it raises)
        log.warning("checkpoint %s written by torch.save as it is: %s", path, error)
        if skeleton != path:
            Path(skeleton).unlink(missing_ok=True)
        torch.save(obj, path)
        return False
    if writer is not None:
        writer.snapshot([_bytes(s) for s in storages], offsets, skeleton, path)
        return True
    fd = os.open(path, os.O_WRONLY)
    try:
        _write(fd, storages, offsets)
    finally:
        os.close(fd)
    return True


class _Nowhere:
    def write(self, data):
        return len(data)


def _storages(obj) -> list[torch.UntypedStorage]:
    """The storages torch.save writes, in the order of its records `data/0`, `data/1`...: the order in which its
    pickler meets them, each once (torch.serialization._save's persistent_id, restated; checked against the
    file's records in _record_offsets)."""
    found: dict[int, torch.UntypedStorage] = {}

    class Finder(pickle.Pickler):
        def persistent_id(self, candidate):
            if isinstance(candidate, torch.storage.TypedStorage):
                storage = candidate._untyped_storage
            elif torch.is_storage(candidate):
                storage = candidate
            else:
                return None
            found.setdefault(storage._cdata, storage)
            return ("storage", len(found))

    with torch.serialization.skip_data():  # as torch.save pickles under it
        Finder(_Nowhere(), protocol=torch.serialization.DEFAULT_PROTOCOL).dump(obj)
    return list(found.values())


def _record_offsets(path: str, storages: list[torch.UntypedStorage]) -> list[int]:
    """Where each storage's bytes go in the file torch.save wrote, once its records are seen to be these
    storages: as many, each of the storage's size."""
    with zipfile.ZipFile(path) as archive:  # record names are "<archive>/data/<key>"
        sizes = {info.filename.split("/", 1)[-1]: info.file_size for info in archive.infolist()}
    records = sorted(name for name in sizes if name.startswith("data/"))
    if len(records) != len(storages):
        raise ValueError(f"{len(records)} storage records in the file, {len(storages)} storages found")
    for key, storage in enumerate(storages):
        if sizes.get(f"data/{key}") != storage.nbytes():
            raise ValueError(f"record data/{key} holds {sizes.get(f'data/{key}')} bytes, its storage "
                             f"{storage.nbytes()}")
    reader = torch._C.PyTorchFileReader(path)
    return [reader.get_record_offset(f"data/{key}") for key in range(len(storages))]


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _pwrite(fd: int, chunk: torch.Tensor, offset: int) -> None:
    view = memoryview(chunk.numpy()).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


_rings: dict[torch.device, list[torch.Tensor]] = {}
_ring_lock = threading.Lock()


def _ring(device: torch.device) -> list[torch.Tensor]:
    with _ring_lock:
        if device not in _rings:
            pinned = torch.empty(CHUNK_BYTES * CHUNKS, dtype=torch.uint8, pin_memory=True)
            _rings[device] = list(pinned.split(CHUNK_BYTES))
        return _rings[device]


def _write(fd: int, storages: list[torch.UntypedStorage], offsets: list[int]) -> None:
    failed = threading.Event()  # a write failed: stop queuing copies

    def write(chunk: torch.Tensor, offset: int, copied=None, done=None) -> None:
        try:
            if copied is not None:
                copied.synchronize()
            _pwrite(fd, chunk, offset)
        except BaseException:
            failed.set()
            raise
        finally:
            if done is not None:
                done()

    with ThreadPoolExecutor(WRITERS, thread_name_prefix="checkpoint-write") as writers:
        futures = [writers.submit(write, data[start:start + CHUNK_BYTES], offset + start)
                   for storage, offset in zip(storages, offsets) if storage.device.type == "cpu"
                   for data in [_bytes(storage)] for start in range(0, storage.nbytes(), CHUNK_BYTES)]
        on_device = [(s, o) for s, o in zip(storages, offsets) if s.device.type != "cpu" and s.nbytes()]
        for device in {s.device for s, _ in on_device}:
            _queue_from(device, [(s, o) for s, o in on_device if s.device == device], writers, write, futures,
                        failed)
        for future in futures:
            future.result()  # the first write that failed (a full disk: OSError ENOSPC) raises here


def _queue_from(device: torch.device, storages, writers: ThreadPoolExecutor, write, futures: list,
                failed: threading.Event) -> None:
    """GPU storages, chunk by chunk through the pinned ring: each chunk's copy is queued on a stream of its own,
    and a writer waits for it, writes it, and hands its buffer back for a later chunk."""
    free: queue.Queue[torch.Tensor] = queue.Queue()
    for buffer in _ring(device):
        free.put(buffer)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # the tensors as the training left them
    with torch.cuda.stream(stream):
        for storage, offset in storages:
            data = _bytes(storage)
            for start in range(0, storage.nbytes(), CHUNK_BYTES):
                size = min(CHUNK_BYTES, storage.nbytes() - start)
                buffer = free.get()
                if failed.is_set():
                    return
                buffer[:size].copy_(data[start:start + size], non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(stream)
                futures.append(writers.submit(write, buffer[:size], offset + start, copied,
                                              lambda buffer=buffer: free.put(buffer)))
