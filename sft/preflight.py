"""Preflight: what the machine has, checked before any model is loaded.

Each check is a function of the measured facts (passed in, so a test can hand it a machine that
fails), and each measurement is a small function of its own. A "fail" makes the run impossible and
stops the job before loading; a "warn" is a problem the run survives, at a cost the message names.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .launch import free_port
from .plan import GIB

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
GB = 10**9  # GB for disk, as df -H and the seed's "115 GB" count

# Docker gives /dev/shm 64 MB; NCCL keeps its intra-node buffers there, and NCCL's troubleshooting
# guide asks for at least --shm-size=1g in containers.
SHM_MIN_BYTES = 1 * GIB
# A DeepSpeed checkpoint holds 16-bit weights (2 bytes/param) and the fp32 optimizer state (12:
# master weights and Adam's two moments): 14 bytes/param, 114.7 GB for Qwen3-8B, the seed's "about
# 115 GB". The ZeRO paper's 16 bytes/param also counts 16-bit gradients, which are not saved.
CHECKPOINT_BYTES_PER_PARAM = 2 + 12
FINAL_MODEL_BYTES_PER_PARAM = 2  # final/: the gathered 16-bit model
# Bus bandwidth (nccl-tests' busbw) below which ZeRO-3's traffic will dominate a step; PCIe Gen4 x16
# links reach about 20 GB/s, NVLink several hundred.
ALLREDUCE_WARN_GBPS = 5.0
ALLREDUCE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Check:
    """One check's outcome: a status, what was found and the fix, and facts the job reuses."""

    name: str
    status: str  # ok, info, warn or fail
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


def _offload(zero_stage: str) -> bool | None:
    """Whether a ZeRO option offloads; None for auto (the plan decides later)."""
    return None if zero_stage == "auto" else "offload" in zero_stage


# --- GPUs


def gpu_facts() -> list[tuple[str, int]]:
    """(name, total memory in bytes) of each visible GPU, from torch.cuda."""
    import torch

    if not torch.cuda.is_available():
        return []
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return [(p.name, p.total_memory) for p in props]


def check_gpus(gpus: Sequence[tuple[str, int]], wanted: int | None = None) -> Check:
    """Count, names and memory of the GPUs; none is fine (CPU ranks on gloo)."""
    if not gpus:
        return Check("gpus", INFO, "no GPU: CPU ranks (gloo)", {"count": 0})
    names = sorted({name for name, _ in gpus})
    smallest = min(mem for _, mem in gpus)
    data = {"count": len(gpus), "names": names, "memory_gib": round(smallest / GIB, 2)}
    found = f"{len(gpus)} x {', '.join(names)}, {smallest / GIB:.2f} GiB"
    if wanted is not None and wanted > len(gpus):
        return Check("gpus", FAIL, f"asked for {wanted} GPUs, {len(gpus)} visible ({found}): check "
                     "CUDA_VISIBLE_DEVICES and docker run --gpus all", data)
    if len(names) > 1 or max(mem for _, mem in gpus) != smallest:
        return Check("gpus", WARN, f"{found}: the GPUs differ; the plan uses the smallest", data)
    return Check("gpus", OK, found, data)


# --- nvcc and DeepSpeed's CPU Adam (optimizer offload)


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


def check_nvcc(nvcc: str | None, torch_cuda: str | None, offload: bool | None, has_gpu: bool) -> Check:
    """nvcc is what CPU Adam needs to build on a GPU machine; its CUDA major must match torch's."""
    if not has_gpu:
        return Check("nvcc", INFO, f"nvcc {nvcc or 'absent'}: not needed on CPU ranks (CPU Adam builds with g++)")
    severity = FAIL if offload else WARN
    why = "the offload config needs it" if offload else "needed only if the run offloads"
    if nvcc is None:
        return Check("nvcc", severity, f"no nvcc: DeepSpeed's CPU Adam (optimizer offload) cannot build; {why}. "
                     "Install the CUDA toolkit or use the CUDA devel image")
    if torch_cuda and nvcc.split(".")[0] != torch_cuda.split(".")[0]:
        return Check("nvcc", severity, f"nvcc is CUDA {nvcc}, torch was built for CUDA {torch_cuda}: DeepSpeed "
                     f"refuses to build CPU Adam across major versions; {why}. Install CUDA {torch_cuda.split('.')[0]}"
                     ".x or the matching torch build")
    return Check("nvcc", OK, f"nvcc {nvcc} (torch built for CUDA {torch_cuda or 'none: CPU build'})")


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


def check_cpu_adam(compatible: bool, prebuilt: bool, cached: bool, offload: bool | None) -> Check:
    """DeepSpeed's CPU Adam, which optimizer offload runs on: compatible, and built yet or not."""
    if not compatible:
        severity = FAIL if offload else WARN
        return Check("cpu_adam", severity, "DeepSpeed's CPU Adam is not compatible with this machine (see "
                     "`ds_report`): optimizer offload cannot run; use a stage without offload")
    if prebuilt or cached:
        how = "prebuilt into DeepSpeed" if prebuilt else "built before (torch extensions cache)"
        return Check("cpu_adam", OK, f"CPU Adam compatible, {how}")
    return Check("cpu_adam", OK if offload is False else INFO,
                 "CPU Adam compatible, not built: an offload run builds it on first use (about a minute)")


# --- Host limits and memory


def memlock_limit() -> int | None:
    """The soft `ulimit -l` in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def check_memlock(limit: int | None, offload: bool | None, pinned_bytes: int | None = None) -> Check:
    """Pinned host memory counts against `ulimit -l`; too low and the job turns pin_memory off."""
    if limit is None:
        return Check("memlock", OK, "ulimit -l unlimited: pinned memory allowed", {"pin_memory": True})
    shown = f"ulimit -l is {limit // 1024} KiB"
    if offload is False:
        return Check("memlock", OK, f"{shown}: no offload, nothing large is pinned", {"pin_memory": True})
    if pinned_bytes is not None and limit >= pinned_bytes:
        return Check("memlock", OK, f"{shown}: enough for {pinned_bytes / GIB:.1f} GiB pinned", {"pin_memory": True})
    need = f" (about {pinned_bytes / GIB:.1f} GiB here)" if pinned_bytes else ""
    return Check("memlock", WARN, f"{shown}: offload pins the optimizer state in host memory{need}, which "
                 "counts against it, so pin_memory will be turned off (slower host-GPU copies). To keep it: "
                 "docker run --ulimit memlock=-1", {"pin_memory": False})


def shm_size(path: str = "/dev/shm") -> int:
    """Size in bytes of the filesystem at path (Docker's --shm-size for /dev/shm)."""
    st = os.statvfs(path)
    return st.f_frsize * st.f_blocks


def check_shm(size_bytes: int, gpus: int) -> Check:
    """NCCL needs room in /dev/shm for several GPUs on one machine."""
    shown = f"/dev/shm is {size_bytes / 2**20:.0f} MiB"
    if gpus < 2:
        return Check("shm", OK, f"{shown}: one GPU or none, NCCL needs no shared memory")
    if size_bytes < SHM_MIN_BYTES:
        return Check("shm", FAIL, f"{shown}, too small for NCCL across {gpus} GPUs (Docker's default is 64 MB): "
                     "run the container with --shm-size=16g or --ipc=host")
    return Check("shm", OK, shown)


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


def check_host_memory(available: int, needed: int | None, offload: bool | None) -> Check:
    """Offload keeps the optimizer state (and with offload-all the weights) in host RAM."""
    shown = f"{available / GIB:.1f} GiB of host RAM available"
    if needed is None or offload is False:
        return Check("host_memory", INFO, shown, {"available_gib": round(available / GIB, 2)})
    data = {"available_gib": round(available / GIB, 2), "needed_gib": round(needed / GIB, 2)}
    if available >= needed:
        return Check("host_memory", OK, f"{shown}, offload needs {needed / GIB:.1f}", data)
    severity = FAIL if offload else WARN
    return Check("host_memory", severity, f"{shown}, offload needs {needed / GIB:.1f} (DeepSpeed's estimate): use "
                 "a machine with more RAM, more GPUs, or a stage without offload", data)


# --- Disk


def free_disk(output_dir: str) -> int:
    """Free bytes on the filesystem that will hold output_dir (its nearest existing parent)."""
    path = Path(output_dir).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(free: int, output_dir: str, total_params: int | None, save_total_limit: int | None) -> Check:
    """Room for save_total_limit + 1 checkpoints (the new one is written before the oldest goes) and final/."""
    shown = f"{free / GB:.1f} GB free in {output_dir}"
    if total_params is None:
        return Check("disk", INFO, f"{shown} (model size unknown: not checked)")
    each = CHECKPOINT_BYTES_PER_PARAM * total_params
    kept = 2 if save_total_limit is None else save_total_limit + 1
    needed = kept * each + FINAL_MODEL_BYTES_PER_PARAM * total_params
    what = (f"{kept} checkpoints of {each / GB:.1f} GB ({CHECKPOINT_BYTES_PER_PARAM} bytes/param) and the "
            f"{FINAL_MODEL_BYTES_PER_PARAM * total_params / GB:.1f} GB final model")
    data = {"free_gb": round(free / GB, 1), "needed_gb": round(needed / GB, 1)}
    if free < needed:
        return Check("disk", FAIL, f"{shown}, needs {needed / GB:.1f} GB for {what}: free space, mount a larger "
                     "volume, or lower SFT_SAVE_TOTAL_LIMIT", data)
    if save_total_limit is None:
        return Check("disk", WARN, f"{shown}: no save_total_limit, so every checkpoint stays ({each / GB:.1f} GB "
                     "each); set one", data)
    return Check("disk", OK, f"{shown}, needs {needed / GB:.1f} GB for {what}", data)


# --- Links between GPUs


def nvidia_smi_topo() -> str | None:
    """The text of `nvidia-smi topo -m`, or None without nvidia-smi."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], check=False, capture_output=True, text=True, timeout=60)
        return done.stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpu_links(topo: str) -> set[str]:
    """The kinds of link between distinct GPUs in `nvidia-smi topo -m` (NV12, PIX, PHB, NODE, SYS...)."""
    # On a terminal-less run nvidia-smi still underlines the header (ESC[4m ... ESC[0m): seen on an H200 x2
    lines = re.sub(r"\x1b\[[0-9;]*m", "", topo).splitlines()
    # the header is the indented line of column names; GPU rows start with their name
    header = next((line.split() for line in lines if line[:1].isspace() and line.split()[:1] == ["GPU0"]), [])
    columns = [j for j, name in enumerate(header) if re.fullmatch(r"GPU\d+", name)]
    links = set()
    for line in lines:
        cells = line.split()
        if re.match(r"GPU\d+\s", line):
            links |= {cells[1 + j] for j in columns if 1 + j < len(cells) and cells[1 + j] != "X"}
    return links


def check_topology(gpus: int, topo: str | None) -> Check:
    """How the GPUs are linked: NVLink, or PCIe (where ZeRO-3's extra traffic costs the most)."""
    if gpus < 2:
        return Check("topology", OK, "one GPU or none: no links to check")
    if not topo:
        return Check("topology", WARN, "nvidia-smi topo -m gave nothing: the links between GPUs are unknown")
    links = gpu_links(topo)
    pcie = sorted(k for k in links if not k.startswith("NV"))
    data = {"links": sorted(links), "topo": topo}
    if not links:
        return Check("topology", WARN, "no GPU links found in `nvidia-smi topo -m`: the links are unknown", data)
    if not pcie:
        return Check("topology", OK, f"NVLink between every pair of GPUs ({', '.join(sorted(links))})", data)
    return Check("topology", INFO, f"PCIe between some GPUs ({', '.join(pcie)}): ZeRO-3 moves 1.5x "
                 "ZeRO-2's data over these links, so prefer ZeRO-2 where it fits", data)


def _allreduce_worker(rank: int, world: int, port: int, backend: str, numel: int, iters: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
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
                      timeout_s: float = 180) -> float:
    """All-reduce bus bandwidth in GB/s across `world` local processes, one per GPU (nccl-tests' busbw)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    numel = size_bytes // 4
    args = (world, free_port(), backend, numel, iters, queue)
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


def check_allreduce(gpus: int, busbw_gbps: float | None, error: str | None = None) -> Check:
    """A short all-reduce across the GPUs: the bandwidth ZeRO's gradient and weight traffic gets."""
    if gpus < 2:
        return Check("allreduce", OK, "one GPU or none: no all-reduce to test")
    if busbw_gbps is None:
        return Check("allreduce", WARN, f"all-reduce test did not run: {error or 'skipped'}")
    data = {"busbw_gbps": round(busbw_gbps, 1)}
    shown = f"all-reduce across {gpus} GPUs: {busbw_gbps:.1f} GB/s bus bandwidth"
    if busbw_gbps < ALLREDUCE_WARN_GBPS:
        return Check("allreduce", WARN, f"{shown}, below {ALLREDUCE_WARN_GBPS:g}: ZeRO-3's traffic will dominate "
                     "each step; check `nvidia-smi topo -m`, and NCCL_P2P_DISABLE / NCCL_SHM_DISABLE in the "
                     "environment", data)
    return Check("allreduce", OK, shown, data)


# --- All of them


def run_preflight(output_dir: str, *, zero_stage: str = "auto", total_params: int | None = None,
                  save_total_limit: int | None = 2, host_needed_bytes: int | None = None,
                  gpus_wanted: int | None = None, allreduce: bool = True) -> list[Check]:
    """Measure this machine and run every check; host_needed_bytes: the plan's host estimate (offload)."""
    import torch

    offload = _offload(zero_stage)
    gpus = gpu_facts()
    n = len(gpus)
    checks = [
        check_gpus(gpus, gpus_wanted),
        check_nvcc(nvcc_version(), torch.version.cuda, offload, has_gpu=n > 0),
        check_cpu_adam(*cpu_adam_facts(), offload=offload),
        check_memlock(memlock_limit(), offload, host_needed_bytes),
        check_shm(shm_size(), n),
        check_host_memory(host_memory_available(), host_needed_bytes, offload),
        check_disk(free_disk(output_dir), output_dir, total_params, save_total_limit),
        check_topology(n, nvidia_smi_topo() if n >= 2 else None),
    ]
    busbw, error = None, None
    if n >= 2 and allreduce:
        try:
            busbw = measure_allreduce(n)
        except RuntimeError as e:
            error = str(e)
    checks.append(check_allreduce(n, busbw, error if allreduce else "turned off"))
    return checks


def failed(checks: Sequence[Check]) -> list[Check]:
    """The checks that make the run impossible."""
    return [c for c in checks if c.status == FAIL]


def pin_memory(checks: Sequence[Check]) -> bool:
    """Whether the offload configs may keep pin_memory on (the memlock check's verdict)."""
    return all(c.data.get("pin_memory", True) for c in checks)


def format_checks(checks: Sequence[Check]) -> str:
    """One line per check, for people."""
    width = max((len(c.name) for c in checks), default=0)
    return "\n".join(f"[{c.status:<4}] {c.name:<{width}}  {c.message}" for c in checks)
