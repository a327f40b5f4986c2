"""Preflight: the machine's measured facts (machine.py) checked against what this run needs.

Each check is a pure function of facts, so a test can hand it a machine that fails. A "fail" makes the
run impossible and stops the job before any model is loaded; a "warn" is a problem the run survives,
at a cost the message names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..planner import disk
from ..planner.decision import Decision
from ..planner.rules import pin_memory_rule
from ..units import GB, GIB
from .machine import Facts

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

# Docker gives /dev/shm 64 MB; NCCL keeps its intra-node buffers there, and NCCL's troubleshooting
# guide asks for at least --shm-size=1g in containers.
SHM_MIN_BYTES = 1 * GIB
# Without a decision (`doctor` alone): the seed's bf16 ZeRO-3 AdamW checkpoint, 16-bit weights (2 bytes/param)
# and the fp32 optimizer state (12: master weights and Adam's two moments), 114.7 GB for Qwen3-8B, the
# seed's "about 115 GB". With a decision, planner/disk.py sizes it from the precision, stage and optimizer.
CHECKPOINT_BYTES_PER_PARAM = 2 + 12
FINAL_MODEL_BYTES_PER_PARAM = 2  # final/: the gathered 16-bit model
# Bus bandwidth (nccl-tests' busbw) below which ZeRO-3's traffic will dominate a step; PCIe Gen4 x16
# links reach about 20 GB/s, NVLink several hundred.
ALLREDUCE_WARN_GBPS = 5.0


@dataclass(frozen=True)
class Needs:
    """What the run asks of the machine, from its Decision; unknown (None) for `doctor` without a model."""

    gpus: int | None = None
    offload: bool | None = None
    host_bytes: int | None = None  # what offload keeps in host RAM (DeepSpeed's estimate)
    total_params: int | None = None  # for the disk: None when the run writes no checkpoint (a probe)
    save_total_limit: int | None = 2
    checkpoint_bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM
    final_bytes_per_param: int = FINAL_MODEL_BYTES_PER_PARAM
    checkpoint_why: str = ""  # how checkpoint_bytes_per_param adds up
    final_linked: bool = False  # final/ is links to the last checkpoint's files, no room of its own (disk.final_linked)
    saves: int | None = None  # the checkpoints the run writes, where known (after the probe: the disk's gate)
    probe_follows: bool = False  # the probe times the steps before training: saves are counted then (the disk's gate)

    @classmethod
    def of(cls, d: Decision, total_params: int | None, save_total_limit: int,
           trainer_args: Mapping[str, Any] | None = None, probe_follows: bool = False, *, end_saves: bool) -> Needs:
        """`end_saves`: the run's last step saves a checkpoint (disk.end_checkpoint), of which final/ is links."""
        optimizer = disk.optimizer_of(d.ds_config, trainer_args or {}, d.stage)
        per_param, why = disk.checkpoint_bytes_per_param(d.bf16, d.stage.zero, optimizer)
        return cls(len(d.ranks.gpus) or None, d.offload, d.row.host, total_params, save_total_limit, per_param,
                   disk.weight_bytes(d.bf16), why,
                   disk.final_linked(bool((trainer_args or {}).get("load_best_model_at_end")), end_saves),
                   probe_follows=probe_follows)


@dataclass(frozen=True)
class Check:
    """One check's outcome: a status, what was found and the fix, and facts the job reuses."""

    name: str
    status: str  # ok, info, warn or fail
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


# --- GPUs


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


# --- The NVIDIA driver against the CUDA torch was built for

# The oldest driver each CUDA major runs on, by NVIDIA's minor version compatibility (the CUDA Compatibility guide's
# table: CUDA 13.x >= 580, 12.x >= 525; docs/host.md). torch brings its CUDA libraries, the host brings the driver.
MIN_DRIVER = {"13": 580, "12": 525}
# The image's CUDA lines, newest first: the Dockerfile's CUDA_LINE; a release tags each VERSION-cudaLINE (release.yml).
CUDA_LINES = ("13.0", "12.6")
FORWARD_COMPATIBILITY = "https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html"


def check_driver(torch_cuda: str | None, driver: str | None, driver_gpus: Sequence[str], gpus_seen: int,
                 version: str = "") -> Check:
    """The host's driver runs torch's CUDA. Where it is too old torch sees no GPU, and the job would go on to CPU ranks
    or fail inside one: say so before any rank starts, and which image, driver or package would run.
    driver and driver_gpus: nvidia-smi's, read only where torch sees no GPU; version: the image's (a release's tag)."""
    if not torch_cuda:
        return Check("driver", INFO, "torch is a CPU build: no NVIDIA driver needed")
    if gpus_seen:
        return Check("driver", OK, f"the driver runs torch's CUDA {torch_cuda} ({gpus_seen} GPU(s) visible)")
    if driver is None:
        return Check("driver", INFO, f"no NVIDIA driver here (no nvidia-smi): CPU ranks. For the GPUs: docker run "
                     "--gpus all")
    major = int(re.match(r"\d*", driver).group() or 0)
    need = MIN_DRIVER.get(torch_cuda.split(".")[0], 0)
    data = {"driver": driver, "torch_cuda": torch_cuda, "needs": need, "gpus": list(driver_gpus)}
    if major >= need:
        return Check("driver", WARN, f"NVIDIA driver {driver} runs CUDA {torch_cuda}, and nvidia-smi lists "
                     f"{len(driver_gpus)} GPU(s), yet torch sees none: check CUDA_VISIBLE_DEVICES and docker run "
                     "--gpus", data)
    return Check("driver", FAIL, f"NVIDIA driver {driver} is too old for this image: its torch is built for CUDA "
                 f"{torch_cuda}, which needs driver {need} or newer, so torch sees no GPU. "
                 + driver_remedies(major, torch_cuda, need, driver_gpus, version), data)


def driver_remedies(major: int, torch_cuda: str, need: int, gpu_names: Sequence[str], version: str) -> str:
    """What runs on a driver of this major: another CUDA line of the image, a newer driver, or NVIDIA's forward
    compatibility package (data center GPUs only: no GeForce card has it)."""
    lines = [line for line in CUDA_LINES if line != torch_cuda and MIN_DRIVER[line.split(".")[0]] <= major]
    release = re.fullmatch(r"v?(\d+\.\d+\.\d+\S*)", version)
    ways = [f"the image's CUDA {lines[0]} line ("
            + (f"tag {release.group(1)}-cuda{lines[0]}" if release else f"`make image CUDA_LINE={lines[0]}`")
            + f", for drivers {MIN_DRIVER[lines[0].split('.')[0]]} and newer)"] if lines else []
    ways.append(f"a driver upgraded to {need} or newer")
    if not any("geforce" in name.lower() for name in gpu_names):
        ways.append(f"on data center GPUs, where NVIDIA supports this driver branch, its CUDA forward compatibility "
                    f"package cuda-compat-{torch_cuda.replace('.', '-')} (in NVIDIA's CUDA base images) first on the "
                    f"loader's path: docker run -e LD_LIBRARY_PATH=/usr/local/cuda-{torch_cuda}/compat ... "
                    f"({FORWARD_COMPATIBILITY})")
    return "What runs here: " + "; or ".join(ways) + "."


# --- nvcc and DeepSpeed's CPU Adam (optimizer offload)


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


def check_build_locks(found: Sequence[str]) -> Check:
    """A build lock that a killed process left makes every later load of that DeepSpeed op wait forever, after the
    ranks start, silent (buildlocks.py); the job removes it first."""
    if not found:
        return Check("build_locks", OK, "no torch extension build lock left behind by a killed build")
    return Check("build_locks", INFO, f"{len(found)} torch extension build lock(s) left by a killed build, held by "
                 f"no process: {', '.join(found)}; torch would wait on them forever (pytorch/pytorch#189245): a job "
                 "removes them before its ranks start", {"locks": list(found)})


# --- Host limits and memory


def check_memlock(limit: int | None, offload: bool | None, pinned_bytes: int | None = None) -> Check:
    """Pinned host memory counts against `ulimit -l`; too low and offload runs turn pin_memory off."""
    pin, message = pin_memory_rule(limit, offload, pinned_bytes)
    return Check("memlock", OK if pin else WARN, message, {"pin_memory": pin})


def check_shm(size_bytes: int, gpus: int) -> Check:
    """NCCL needs room in /dev/shm for several GPUs on one machine."""
    shown = f"/dev/shm is {size_bytes / 2**20:.0f} MiB"
    if gpus < 2:
        return Check("shm", OK, f"{shown}: one GPU or none, NCCL needs no shared memory")
    if size_bytes < SHM_MIN_BYTES:
        return Check("shm", FAIL, f"{shown}, too small for NCCL across {gpus} GPUs (Docker's default is 64 MB): "
                     "run the container with --shm-size=16g or --ipc=host")
    return Check("shm", OK, shown)


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


def check_disk(free: int, output_dir: str, total_params: int | None, save_total_limit: int | None,
               per_param: float = CHECKPOINT_BYTES_PER_PARAM, final_per_param: int = FINAL_MODEL_BYTES_PER_PARAM,
               why: str = "", on_disk: int = 0, saves: int | None = None, probe_follows: bool = False) -> Check:
    """Room for save_total_limit + 1 checkpoints (the new one is written before the oldest goes) and final/, less
    the `on_disk` complete ones a resume finds there (they count toward the limit, and at least one more is written);
    per_param: a checkpoint's bytes per parameter (why: how they add up, planner/disk.py). `saves`: the checkpoints
    the run writes, where the probe's speed tells (SFT_SAVE_MINUTES' cadence): a short run keeps fewer at once.
    `probe_follows`: saves not known yet, but counted after the probe; room for one more passes until then."""
    shown = f"{free / GB:.1f} GB free in {output_dir}"
    if total_params is None:
        return Check("disk", INFO, f"{shown} (model size unknown: not checked)")
    each = per_param * total_params
    kept = 2 if save_total_limit is None else save_total_limit + 1
    at_once = kept if saves is None else min(kept, on_disk + saves)
    more = max(at_once - on_disk, 1)
    needed = more * each + final_per_param * total_params
    final = (f"the {final_per_param * total_params / GB:.1f} GB final model" if final_per_param else
             "final/ (links to the last checkpoint's model files)")
    count = f"{more} more checkpoint(s) ({on_disk} on the disk already)" if on_disk else \
        f"{more} checkpoints" if more > 1 else "1 checkpoint"
    what = f"{count} of {each / GB:.1f} GB ({why or f'{per_param:g} bytes/param'}) and {final}" + (
        f"; the run saves {saves} in all" if saves is not None else "")
    data = {"free_gb": round(free / GB, 1), "needed_gb": round(needed / GB, 1)}
    if free < needed and probe_follows and saves is None and free >= each + final_per_param * total_params:
        return Check("disk", WARN, f"{shown}, short of the {needed / GB:.1f} GB for {what} if the run saves that "
                     "many: counted again after the probe, from the run's steps and its speed", data)
    if free < needed:
        return Check("disk", FAIL, f"{shown}, needs {needed / GB:.1f} GB for {what}: free space, mount a larger "
                     "volume, or lower SFT_SAVE_TOTAL_LIMIT", data)
    if save_total_limit is None:
        return Check("disk", WARN, f"{shown}: no save_total_limit, so every checkpoint stays ({each / GB:.1f} GB "
                     "each); set one", data)
    return Check("disk", OK, f"{shown}, needs {needed / GB:.1f} GB for {what}", data)


# --- Links between GPUs


def gpu_links(topo: str) -> set[str]:
    """The kinds of link between distinct GPUs in `nvidia-smi topo -m` (NV12, PIX, PHB, NODE, SYS...)."""
    # On a terminal-less run nvidia-smi still underlines the header (ESC[4m ... ESC[0m): docs/multi-gpu.md
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


def run(facts: Facts, needs: Needs) -> list[Check]:
    """Every check of the measured facts against what the run needs."""
    m = facts.machine
    gpus = [(g.name, g.memory_bytes) for g in m.gpus]
    n = len(gpus)
    checks = [
        check_driver(facts.torch_cuda, facts.driver, facts.driver_gpus, n, facts.version),
        check_gpus(gpus, needs.gpus),
        check_nvcc(facts.nvcc, facts.torch_cuda, needs.offload, has_gpu=n > 0),
        check_cpu_adam(*facts.cpu_adam, offload=needs.offload),
        check_build_locks(facts.build_locks),
        check_memlock(m.memlock_bytes, needs.offload, needs.host_bytes),
        check_shm(facts.shm_bytes, n),
        check_host_memory(m.host_memory_bytes or 0, needs.host_bytes, needs.offload),
        disk_for(facts, needs),
        check_topology(n, facts.topology),
        check_allreduce(n, facts.allreduce_gbps, facts.allreduce_error),
    ]
    return checks


def disk_for(facts: Facts, needs: Needs) -> Check:
    """check_disk on the measured facts: at the start, and after the probe with the run's saves (job.py)."""
    return check_disk(facts.free_disk_bytes, facts.output_dir, needs.total_params, needs.save_total_limit,
                      needs.checkpoint_bytes_per_param, 0 if needs.final_linked else needs.final_bytes_per_param,
                      needs.checkpoint_why, facts.checkpoints_on_disk, needs.saves, needs.probe_follows)


def failed(checks: Sequence[Check]) -> list[Check]:
    """The checks that make the run impossible."""
    return [c for c in checks if c.status == FAIL]


def format_checks(checks: Sequence[Check]) -> str:
    """One line per check, for people."""
    width = max((len(c.name) for c in checks), default=0)
    return "\n".join(f"[{c.status:<4}] {c.name:<{width}}  {c.message}" for c in checks)
