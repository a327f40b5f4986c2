"""What this machine has, measured: GPUs, host RAM, limits, toolchain, disk, links.

Each measurement is a small function of its own; `measure` gathers what every start needs into Facts
(the decision reads Facts.machine), and `measure_links` adds what only several GPUs need. The checks
on these facts are in preflight.py.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..checkpoints import complete, free_disk
from ..nodes import free_port
from ..planner.inputs import GPU, Machine, Ranks
from ..planner.rules import FLASH_ATTENTION_4_CAPABILITY
from ..settings.checks import flash_attention_4_installed, liger_available
from ..version import version
from . import buildlocks

ALLREDUCE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Facts:
    """The machine as measured at start; `machine` is what the decision needs of it."""

    machine: Machine
    output_dir: str
    nvcc: str | None = None  # the CUDA release of the nvcc DeepSpeed's op builder would find
    torch_cuda: str | None = None  # the CUDA torch was built for
    driver: str | None = None  # the NVIDIA driver's version, read where torch's CUDA sees no GPU (nvidia_driver)
    driver_gpus: tuple[str, ...] = ()  # the GPUs nvidia-smi lists then
    version: str = ""  # the image's (sft/version.py): a release's names its tags
    cpu_adam: tuple[bool, bool, bool] = (True, False, False)  # compatible, prebuilt, built before
    build_locks: tuple[str, ...] = ()  # torch extension build locks a killed build left (buildlocks.py)
    shm_bytes: int = 0
    free_disk_bytes: int = 0
    checkpoints_on_disk: int = 0  # the complete checkpoints in the output folder (a resume's): on the disk already
    topology: str | None = None  # `nvidia-smi topo -m`, with several GPUs
    allreduce_gbps: float | None = None
    allreduce_error: str | None = "not measured"
    import_check: ImportCheck | None = None  # FlashAttention-4's, running: `settled` reads it into machine


def measure(output_dir: str, nodes: int = 1, attention: str = "auto", early: ImportCheck | None = None,
            found: tuple[GPU, ...] | None = None) -> Facts:
    """Everything a start checks; cheap (no GPU work; no subprocess but nvcc --version, and FlashAttention-4's
    import where a GPU could run it and SFT_ATTENTION allows it, running in the background: `early`'s if the
    entrypoint started it (`early_import_check`), else started here; `settled` waits for it, once the Hub and
    the data are checked); nvidia-smi where torch's CUDA sees no GPU. `found`: the GPUs, where the caller read them
    already (once a start)."""
    found = gpus() if found is None else found
    could_run = flash_attention_4_may_run(found, attention)
    if early is not None and not could_run:
        early.cancel()  # no GPU here runs FlashAttention-4: its import says nothing the decision reads
    machine = Machine(gpus=found, host_memory_bytes=host_memory_available(), memlock_bytes=memlock_limit(),
                      liger_installed=liger_available(), flash_attention_4_installed=flash_attention_4_installed(),
                      nodes=nodes)
    cuda, driver, driver_gpus = driver_facts(found)
    return Facts(machine, output_dir, nvcc=nvcc_version(), torch_cuda=cuda, driver=driver, driver_gpus=driver_gpus,
                 version=version(), cpu_adam=cpu_adam_facts(), build_locks=buildlocks.stale(), shm_bytes=shm_size(),
                 free_disk_bytes=free_disk(output_dir), checkpoints_on_disk=len(complete(Path(output_dir))),
                 import_check=(early or early_import_check(attention)) if could_run else None)


def flash_attention_4_may_run(found: Sequence[GPU], attention: str) -> bool:
    """Whether the decision may choose FlashAttention-4 here (if its import check passes): installed, allowed by
    SFT_ATTENTION, and a GPU that runs it."""
    return (attention in ("auto", "flash_attention_4") and flash_attention_4_installed()
            and any(g.capability >= FLASH_ATTENTION_4_CAPABILITY for g in found))


def early_import_check(attention: str) -> ImportCheck | None:
    """FlashAttention-4's import check, started before the settings' inputs are read, where it is installed and
    SFT_ATTENTION allows it (whether a GPU here can run it is known later: `measure` cancels it if none can).
    Why so early: reading the model's shape imports torch and Transformers' modelling code, seconds that the check's own
    imports now run beside; started after them, the decision waited for it, longer on a slower host (measured:
    docs/speed.md, 'the start counted from the process's start'; 'where a new folder's start goes')."""
    if attention in ("auto", "flash_attention_4") and flash_attention_4_installed():
        return ImportCheck.start("flash_attn.cute")
    return None


def settled(facts: Facts) -> Facts:
    """The facts with FlashAttention-4's import check (if measure started one) finished: what decide reads."""
    if facts.import_check is None:
        return facts
    broken = facts.import_check.error()
    return replace(facts, machine=replace(facts.machine, flash_attention_4_broken=broken), import_check=None)


def measure_links(facts: Facts, ranks: Ranks) -> Facts:
    """With several GPUs: how they are linked, and a short all-reduce across them."""
    if len(ranks.gpus) < 2:
        return facts
    try:
        busbw, error = measure_allreduce(len(ranks.gpus), devices=ranks.gpus), None
    except RuntimeError as e:
        busbw, error = None, str(e)
    return replace(facts, topology=nvidia_smi_topo(), allreduce_gbps=busbw, allreduce_error=error)


def process_started_at() -> float:
    """When this process started, as time.time(): from Linux's /proc/self/stat (its start in clock ticks on the
    boot-time clock), so what ran before the job's code (the interpreter, reading the settings' inputs: the
    model's shape imports torch and Transformers' modelling code) is counted; elsewhere, now. (Not /proc/stat's
    boot time: whole seconds, so up to a second off.)"""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])  # field 22: starttime
        running = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
    return time.time() - running


def gpus() -> tuple[GPU, ...]:
    """Name and total memory of each GPU this process sees, from torch.cuda."""
    import torch

    if not torch.cuda.is_available():
        return ()
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return tuple(GPU(p.name, p.total_memory, (p.major, p.minor)) for p in props)


class ImportCheck:
    """`import MODULE` tried in a child process, started at once and read later (`error`): finding flash-attn-4
    (sft/settings/checks.py) cannot tell a missing CUDA library, which would otherwise fail every rank at its first
    step. A child, as importing the CuTe DSL loads CUDA's libraries into the process; in the background, as it takes
    seconds, time the Hub and data checks now hide (measured: docs/speed.md,
    'FlashAttention-4 is auto for compiled layers' and
    'start to first step 57.5 s with nothing cached, 47.6 s cached')."""

    def __init__(self, module: str, child: subprocess.Popen, began: float, timeout_s: float):
        self.module, self.child, self.began, self.timeout_s = module, child, began, timeout_s

    @classmethod
    def start(cls, module: str, timeout_s: float = 120) -> ImportCheck:
        import sys

        child = subprocess.Popen([sys.executable, "-c", f"import {module}"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return cls(module, child, time.monotonic(), timeout_s)

    def error(self) -> str:
        """Why the import failed ("" where it worked); waits for the child, up to timeout_s from its start."""
        try:
            _, stderr = self.child.communicate(timeout=max(self.began + self.timeout_s - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.communicate()
            return f"importing {self.module} took more than {self.timeout_s:.0f} s"
        lines = (stderr or "").strip().splitlines()
        return "" if self.child.returncode == 0 else (lines[-1] if lines else f"exit code {self.child.returncode}")

    def cancel(self) -> None:
        """Stop the child, its answer no longer wanted (the settings refused, or no GPU here can use it)."""
        if self.child.poll() is None:
            self.child.kill()
        self.child.communicate()


def driver_facts(found: Sequence[GPU]) -> tuple[str | None, str | None, tuple[str, ...]]:
    """torch's CUDA, and where torch's CUDA sees none of the GPUs (`found`) nvidia-smi's driver and GPUs: what
    preflight.check_driver reads."""
    cuda = torch_cuda()
    return (cuda, *nvidia_driver()) if cuda and not found else (cuda, None, ())


def torch_cuda() -> str | None:
    """The CUDA torch was built for ("13.0"), None for a CPU build. SFTTEST_TORCH_CUDA stands in for it where tests run
    the driver check on a CPU build (tests/test_driver.py)."""
    import torch

    return os.environ.get("SFTTEST_TORCH_CUDA") or torch.version.cuda


def nvidia_driver() -> tuple[str | None, tuple[str, ...]]:
    """The NVIDIA driver's version ("580.65.06") and the GPUs' names, from nvidia-smi, which answers whatever the
    driver's age (torch sees no GPU when its CUDA is newer than the driver); (None, ()) without an answer."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"], check=False,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, ()
    rows = [[cell.strip() for cell in line.split(",", 1)] for line in done.stdout.splitlines() if "," in line]
    if done.returncode != 0 or not rows:
        return None, ()
    return rows[0][0], tuple(name for _, name in rows)


def nvcc_version(path: str | None = None, cuda_home: str | None = None,
                 default_cuda_dir: str = "/usr/local/cuda") -> str | None:
    """The CUDA release of the nvcc DeepSpeed's op builder would find ("13.0"), or None."""
    # torch.utils.cpp_extension looks in CUDA_HOME/CUDA_PATH, then PATH, then /usr/local/cuda
    home = cuda_home if cuda_home is not None else os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [os.path.join(home, "bin", "nvcc")] if home else []
    candidates += [shutil.which("nvcc", path=path), os.path.join(default_cuda_dir, "bin", "nvcc")]
    nvcc = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def cpu_adam_facts() -> tuple[bool, bool, bool]:
    """(compatible, prebuilt, built before) for DeepSpeed's CPU Adam; builds nothing."""
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from torch.utils.cpp_extension import _get_build_directory

    builder = CPUAdamBuilder()
    compatible = bool(builder.is_compatible(verbose=False))
    prebuilt = bool(installed_ops.get(builder.NAME, False))
    cached = (Path(_get_build_directory(builder.name, verbose=False)) / f"{builder.name}.so").exists()
    return compatible, prebuilt, cached


def memlock_limit() -> int | None:
    """The soft `ulimit -l` in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def shm_size(path: str = "/dev/shm") -> int:
    """Size in bytes of the filesystem at path (Docker's --shm-size for /dev/shm)."""
    st = os.statvfs(path)
    return st.f_frsize * st.f_blocks


def host_memory_available(meminfo: str = "/proc/meminfo",
                          cgroup_files: Sequence[str] = ("/sys/fs/cgroup/memory.max",
                                                         "/sys/fs/cgroup/memory/memory.limit_in_bytes")) -> int:
    """Bytes of RAM available: MemAvailable, capped by the container's cgroup limit."""
    text = Path(meminfo).read_text()
    available = int(re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024
    for name in cgroup_files:  # a container sees the host's meminfo; its own limit is here
        try:
            raw = Path(name).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            available = min(available, int(raw))
    return available


def nvidia_smi_topo() -> str | None:
    """The text of `nvidia-smi topo -m`, or None without nvidia-smi."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], check=False, capture_output=True, text=True, timeout=60)
        return done.stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _allreduce_worker(rank: int, world: int, port: int, backend: str, numel: int, iters: int, queue: Any,
                      devices: Sequence[int]) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", devices[rank]) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL starts, so each rank owns its GPU
    dist.init_process_group(backend, rank=rank, world_size=world)
    x = torch.ones(numel, dtype=torch.float32, device=device)
    for _ in range(2):  # warm-up: NCCL sets up its rings on the first call
        dist.all_reduce(x)
    dist.barrier()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    if rank == 0:
        queue.put((time.perf_counter() - start) / iters)
    dist.barrier()
    dist.destroy_process_group()


def measure_allreduce(world: int, backend: str = "nccl", size_bytes: int = ALLREDUCE_BYTES, iters: int = 10,
                      timeout_s: float = 180, devices: Sequence[int] | None = None) -> float:
    """All-reduce bus bandwidth in GB/s across `world` local processes, one per GPU (nccl-tests' busbw);
    devices: the GPU of each (default 0 .. world-1)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    numel = size_bytes // 4
    args = (world, free_port(), backend, numel, iters, queue, tuple(devices or range(world)))
    procs = [ctx.Process(target=_allreduce_worker, args=(rank, *args), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.terminate()
    if hung or any(p.exitcode != 0 for p in procs) or queue.empty():
        raise RuntimeError(f"all-reduce test failed (exit codes {[p.exitcode for p in procs]})")
    seconds = queue.get()
    # bus bandwidth: what each link carries in a ring all-reduce, 2(n-1)/n of the buffer
    return numel * 4 * 2 * (world - 1) / world / seconds / 1e9
