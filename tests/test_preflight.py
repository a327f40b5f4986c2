"""Preflight on CPU: each measurement on this machine, each check handed a machine that fails it, and its message."""

import dataclasses
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint_layout import make_checkpoint
from conftest import tmpfs
from sft import checkpoints
from sft.controller import machine as m
from sft.controller import preflight as pf
from sft.planner import disk
from sft.planner.inputs import GPU, Machine

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30
QWEN3_8B_PARAMS = 8_190_735_360

TOPO_NVLINK = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tNV18\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\t0-47\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\t48-95\t1\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \t48-95\t1\t\tN/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TOPO_PCIE = """\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNODE\tSYS\tPIX\t0-31\t0\t\tN/A
GPU1\tNODE\t X \tSYS\tNODE\t0-31\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tSYS\t32-63\t1\t\tN/A
NIC0\tPIX\tNODE\tSYS\t X \t\t\t\t

Legend:

  X    = Self
"""


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB filesystem: a full disk, or Docker's too-small /dev/shm."""
    with tmpfs(tmp_path / "tiny", "1m") as folder:
        yield folder


def _script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- GPUs


def test_no_gpu_is_cpu_ranks():
    c = pf.check_gpus([])
    assert (c.status, c.message) == ("info", "no GPU: CPU ranks (gloo)")


def test_gpus_found_fewer_than_wanted_and_mixed():
    h200 = ("NVIDIA H200", int(139.8 * GIB))
    ok = pf.check_gpus([h200] * 8, wanted=8)
    assert (ok.status, ok.message) == ("ok", "8 x NVIDIA H200, 139.80 GiB")
    assert ok.data == {"count": 8, "names": ["NVIDIA H200"], "memory_gib": 139.8}
    few = pf.check_gpus([h200] * 4, wanted=8)
    assert few.status == "fail" and few.message.startswith("asked for 8 GPUs, 4 visible")
    mixed = pf.check_gpus([h200, ("NVIDIA L40S", int(44.4 * GIB))])
    assert mixed.status == "warn" and "the plan uses the smallest" in mixed.message


# --- nvcc and CPU Adam


def test_no_nvcc_on_the_path(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    found = m.nvcc_version(path=str(empty), cuda_home="", default_cuda_dir=str(tmp_path / "no-cuda"))
    assert found is None
    c = pf.check_nvcc(found, "13.0", offload=True, has_gpu=True)
    assert c.status == "fail"
    assert c.message == ("no nvcc: DeepSpeed's CPU Adam (optimizer offload) cannot build; the offload config needs "
                         "it. Install the CUDA toolkit or use the CUDA devel image")
    assert pf.check_nvcc(found, "13.0", offload=False, has_gpu=True).status == "warn"
    assert pf.check_nvcc(found, None, offload=True, has_gpu=False).status == "info"


def test_nvcc_of_another_cuda_major(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir, "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    found = m.nvcc_version(path=str(bin_dir), cuda_home="", default_cuda_dir=str(tmp_path / "no-cuda"))
    assert found == "12.4"
    c = pf.check_nvcc(found, "13.0", offload=True, has_gpu=True)
    assert c.status == "fail" and c.message.startswith("nvcc is CUDA 12.4, torch was built for CUDA 13.0")
    assert pf.check_nvcc(found, "12.8", offload=True, has_gpu=True).status == "ok"


def test_cuda_home_wins_over_path(tmp_path):
    for name, release in (("home", "13.0"), ("path", "12.4")):
        (tmp_path / name / "bin").mkdir(parents=True)
        _script(tmp_path / name / "bin", "nvcc", f"#!/bin/sh\necho 'release {release}, V{release}.1'\n")
    found = m.nvcc_version(path=str(tmp_path / "path" / "bin"), cuda_home=str(tmp_path / "home"))
    assert found == "13.0"


def test_cpu_adam_on_this_machine_and_when_incompatible():
    compatible, prebuilt, cached = m.cpu_adam_facts()
    assert compatible  # g++ is here; nothing was built by asking
    c = pf.check_cpu_adam(compatible, prebuilt, cached, offload=True)
    assert c.status in ("ok", "info") and c.message.startswith("CPU Adam compatible")
    bad = pf.check_cpu_adam(False, False, False, offload=True)
    assert bad.status == "fail" and "optimizer offload cannot run" in bad.message
    assert pf.check_cpu_adam(False, False, False, offload=False).status == "warn"


# --- memlock, /dev/shm, host RAM, disk


def test_low_memlock_turns_pin_memory_off():
    c = pf.check_memlock(64 * 1024, offload=True, pinned_bytes=183 * GIB)
    assert c.status == "warn" and c.data == {"pin_memory": False}
    assert c.message.startswith("ulimit -l is 64 KiB: offload pins the optimizer state in host memory (about "
                                "183.0 GiB here)")
    assert c.message.endswith("docker run --ulimit memlock=-1")
    assert pf.check_memlock(None, offload=True).data == {"pin_memory": True}
    assert pf.check_memlock(64 * 1024, offload=False).status == "ok"


def test_low_memlock_measured_in_a_shell_with_ulimit():
    code = ("from sft.controller import machine as m, preflight as pf; "
            "c = pf.check_memlock(m.memlock_limit(), offload=True); "
            "print(c.status, c.data['pin_memory'], c.message.split(':')[0])")
    out = subprocess.run(["bash", "-c", f"ulimit -l 64 && {sys.executable} -c \"{code}\""], cwd=REPO, check=False,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip().splitlines()[-1] == "warn False ulimit -l is 64 KiB", out.stderr


def test_small_shm_fails_with_several_gpus(tiny_tmpfs):
    size = m.shm_size(str(tiny_tmpfs))
    assert size == 2**20
    c = pf.check_shm(size, gpus=8)
    assert c.status == "fail"
    assert c.message == ("/dev/shm is 1 MiB, too small for NCCL across 8 GPUs (Docker's default is 64 MB): run the "
                         "container with --shm-size=16g or --ipc=host")
    assert pf.check_shm(size, gpus=1).status == "ok"
    assert pf.check_shm(64 * 2**20, gpus=2).status == "fail"  # Docker's default
    assert pf.check_shm(16 * GIB, gpus=8).status == "ok"


def test_full_disk_fails(tiny_tmpfs):
    out = str(tiny_tmpfs / "out" / "run")  # not made yet: measured on its nearest existing parent
    free = checkpoints.free_disk(out)
    assert free <= 2**20
    c = pf.check_disk(free, out, total_params=10_000_000, save_total_limit=2)
    assert c.status == "fail"
    assert c.message == (f"0.0 GB free in {out}, needs 0.4 GB for 3 checkpoints of 0.1 GB (14 bytes/param) and "
                         "the 0.0 GB final model: free space, mount a larger volume, or lower SFT_SAVE_TOTAL_LIMIT")


def test_disk_for_qwen3_8b_uses_the_seeds_figures():
    # the seed: a checkpoint is about 115 GB (16.4 GB bf16 weights + 98.3 GB fp32 optimizer state)
    c = pf.check_disk(400 * 10**9, "/out", QWEN3_8B_PARAMS, save_total_limit=2)
    assert c.status == "ok"
    assert "needs 360.4 GB for 3 checkpoints of 114.7 GB (14 bytes/param) and the 16.4 GB final model" in c.message
    assert pf.check_disk(300 * 10**9, "/out", QWEN3_8B_PARAMS, 2).status == "fail"
    assert pf.check_disk(200 * 10**9, "/out", QWEN3_8B_PARAMS, None).status == "fail"  # room for 2 at least
    assert pf.check_disk(10**12, "/out", QWEN3_8B_PARAMS, None).status == "warn"
    assert pf.check_disk(10**9, "/out", None, 2).status == "info"


def test_disk_sized_from_the_decision_of_an_fp32_run():
    """Before: 14 bytes/param whatever the run; an fp32 ZeRO-2 checkpoint takes 20 (planner/disk.py)."""
    c = pf.check_disk(400 * 10**9, "/out", QWEN3_8B_PARAMS, 2, per_param=20, final_per_param=4, why="20 bytes/param: x")
    assert c.status == "fail"
    assert "needs 524.2 GB for 3 checkpoints of 163.8 GB (20 bytes/param: x) and the 32.8 GB final model" in c.message


def test_a_resume_counts_the_checkpoints_on_the_disk_toward_the_limit(tmp_path):
    """A resumed run's checkpoints are on the disk already and count toward SFT_SAVE_TOTAL_LIMIT: the disk needs room
    for the ones still to come, one at least. Before: a resume on an H100 machine was refused for 55.1 GB (two
    checkpoints of Qwen3-1.7B at limit 1) with one of them on that disk already."""
    out = tmp_path / "out"
    for step in (20, 40):
        make_checkpoint(out, step, ranks=1)
    make_checkpoint(out, 60, ranks=1, complete=False)  # torn: not counted
    assert m.measure(str(out)).checkpoints_on_disk == 2
    each = 16 * QWEN3_8B_PARAMS
    resumed = pf.check_disk(int(1.1 * each), "/out", QWEN3_8B_PARAMS, 2, 16, 0, on_disk=2)
    assert resumed.status == "ok" and "for 1 more checkpoint(s) (2 on the disk already) of 131.1 GB" in resumed.message
    assert pf.check_disk(int(1.1 * each), "/out", QWEN3_8B_PARAMS, 2, 16, 0, on_disk=0).status == "fail"
    assert pf.check_disk(int(0.9 * each), "/out", QWEN3_8B_PARAMS, 2, 16, 0, on_disk=5).status == "fail"  # one more
    assert pf.check_disk(int(2.1 * each), "/out", QWEN3_8B_PARAMS, 2, 16, 0, on_disk=1).status == "ok"


def test_the_disk_holds_the_checkpoints_the_run_saves_once_the_probe_tells_how_many():
    each = 16 * QWEN3_8B_PARAMS
    short = int(2.5 * each)  # two checkpoints, not the limit's three
    assert pf.check_disk(short, "/out", QWEN3_8B_PARAMS, 2, 16, 0).status == "fail"  # no probe: the limit's
    deferred = pf.check_disk(short, "/out", QWEN3_8B_PARAMS, 2, 16, 0, probe_follows=True)
    assert deferred.status == "warn" and "counted again after the probe" in deferred.message
    assert pf.check_disk(int(0.9 * each), "/out", QWEN3_8B_PARAMS, 2, 16, 0, probe_follows=True).status == "fail"
    once = pf.check_disk(short, "/out", QWEN3_8B_PARAMS, 2, 16, 0, saves=1)  # the end's save alone
    assert once.status == "ok" and once.message.endswith("; the run saves 1 in all")
    assert pf.check_disk(short, "/out", QWEN3_8B_PARAMS, 2, 16, 0, saves=2).status == "ok"
    assert pf.check_disk(short, "/out", QWEN3_8B_PARAMS, 2, 16, 0, saves=7).status == "fail"  # three at once
    assert pf.check_disk(short, "/out", QWEN3_8B_PARAMS, 2, 16, 0, on_disk=2, saves=1).status == "ok"


def test_a_checkpoints_real_size_against_the_room_left(tiny_tmpfs):
    """After a save (in rank 0): the size the checkpoint takes, measured, against the disk's free space."""
    checkpoint = tiny_tmpfs / "out" / "checkpoint-20"
    checkpoint.mkdir(parents=True)
    (checkpoint / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 300_000)
    size = checkpoints.folder_bytes(checkpoint.parent)
    assert 300_000 <= size <= 300_000 + 3 * 4096  # allocated blocks, as du counts them
    free = checkpoints.free_disk(str(checkpoint))
    assert free < 2**20 - 300_000
    fits, message = disk.room_after_save(size, free, kept=1, save_total_limit=2, left=3, final_bytes=200_000)
    assert not fits and "the disk would fill before the run ends, so it stops now" in message
    fits, message = disk.room_after_save(size, free, kept=1, save_total_limit=2, left=1, final_bytes=200_000)
    assert fits and "(1 more checkpoint(s) at once and the 0.0002 GB final model)" in message


def test_host_memory_capped_by_the_container(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   125829120 kB\n")
    cgroup = tmp_path / "memory.max"
    cgroup.write_text(f"{64 * GIB}\n")
    unlimited = tmp_path / "v1_limit"
    unlimited.write_text("max\n")
    assert m.host_memory_available(str(meminfo), [str(unlimited)]) == 125829120 * 1024
    available = m.host_memory_available(str(meminfo), [str(cgroup), str(unlimited)])
    assert available == 64 * GIB
    c = pf.check_host_memory(available, needed=int(183.08 * GIB), offload=True)
    assert c.status == "fail"
    assert c.message == ("64.0 GiB of host RAM available, offload needs 183.1 (DeepSpeed's estimate): use a "
                         "machine with more RAM, more GPUs, or a stage without offload")
    assert pf.check_host_memory(available, int(183.08 * GIB), offload=None).status == "warn"
    assert pf.check_host_memory(available, int(183.08 * GIB), offload=False).status == "info"
    assert m.host_memory_available() > 0  # this machine's own files


# --- links between GPUs


def test_topology_nvlink_and_pcie():
    assert pf.gpu_links(TOPO_NVLINK) == {"NV18"}
    ok = pf.check_topology(4, TOPO_NVLINK)
    assert ok.status == "ok" and ok.message == "NVLink between every pair of GPUs (NV18)"
    assert pf.gpu_links(TOPO_PCIE) == {"NODE", "SYS"}  # the NIC's PIX column is not a GPU link
    pcie = pf.check_topology(3, TOPO_PCIE)
    assert pcie.status == "info" and pcie.message.startswith("PCIe between some GPUs (NODE, SYS)")
    assert pf.check_topology(2, None).status == "warn"
    assert pf.check_topology(1, None).status == "ok"


def test_topology_with_the_underlined_header_of_an_h200_x2():
    # `nvidia-smi topo -m` as it came back from a 2 x H200 machine (2026-11-29), escape codes and all
    topo = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n")
    assert pf.gpu_links(topo) == {"NV18"}
    assert pf.check_topology(2, topo).message == "NVLink between every pair of GPUs (NV18)"
    unreadable = pf.check_topology(2, "something else entirely\n")
    assert unreadable.status == "warn" and "links are unknown" in unreadable.message


def test_allreduce_measured_on_two_cpu_ranks():
    busbw = m.measure_allreduce(2, backend="gloo", size_bytes=4 * 2**20, iters=2, timeout_s=120)
    assert busbw > 0
    slow = pf.check_allreduce(2, 1.0)
    assert slow.status == "warn" and slow.message.startswith("all-reduce across 2 GPUs: 1.0 GB/s bus bandwidth, "
                                                            "below 5")
    assert pf.check_allreduce(8, 350.0).status == "ok"
    assert pf.check_allreduce(1, None).status == "ok"
    failed = pf.check_allreduce(2, None, "all-reduce test failed (exit codes [1, 1])")
    assert failed.status == "warn" and failed.message.endswith("exit codes [1, 1])")


# --- all of them


def test_preflight_of_this_machine_for_a_run_that_offloads(tmp_path):
    facts = m.measure(str(tmp_path / "out"))
    assert facts.machine.host_memory_bytes > 0 and facts.free_disk_bytes > 0 and facts.shm_bytes > 0
    needs = pf.Needs(gpus=None, offload=True, host_bytes=GIB, total_params=1_000_000, save_total_limit=2)
    checks = pf.run(facts, needs)
    names = [c.name for c in checks]
    assert names == ["driver", "gpus", "nvcc", "cpu_adam", "build_locks", "memlock", "shm", "host_memory", "disk", "topology",
                     "allreduce"]
    assert all(c.status in ("ok", "info", "warn", "fail") for c in checks)
    assert not pf.failed(checks)
    by_name = {c.name: c for c in checks}
    assert "offload needs 1.0" in by_name["host_memory"].message  # checked, not "info": the run offloads
    assert "needs 0.0 GB for 3 checkpoints" in by_name["disk"].message
    text = pf.format_checks(checks)
    assert len(text.splitlines()) == len(checks)
    assert text.splitlines()[8].startswith("[ok  ] disk         ")


def test_the_import_check_runs_in_a_child_beside_the_job_and_reports_why_it_failed(tmp_path, monkeypatch):
    """FlashAttention-4's import check (a real child process): started by measure, read by settled."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(30)\n")
    (tmp_path / "broken_install.py").write_text("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    began = time.monotonic()
    fine, slow = m.ImportCheck.start("json"), m.ImportCheck.start("slow_to_import", timeout_s=3)
    broken, missing = m.ImportCheck.start("broken_install"), m.ImportCheck.start("no_such_module_here")
    assert time.monotonic() - began < 2  # started, not waited for
    assert fine.error() == ""
    assert broken.error() == "ImportError: libcuda.so.1: cannot open shared object file"
    assert missing.error() == "ModuleNotFoundError: No module named 'no_such_module_here'"
    assert slow.error() == "importing slow_to_import took more than 3 s" and slow.child.returncode is not None
    assert time.monotonic() - began < 25  # the slow one was stopped at its limit, not waited out

    facts = m.measure(str(tmp_path / "out"))  # CPU: no GPU could run FlashAttention-4, so nothing is started
    assert facts.import_check is None and m.settled(facts) is facts
    pending = dataclasses.replace(facts, import_check=m.ImportCheck.start("broken_install"))
    done = m.settled(pending)
    assert done.import_check is None and done.machine.flash_attention_4_broken.startswith("ImportError: libcuda")


def test_an_early_import_check_is_kept_where_a_gpu_could_use_it_and_stopped_where_none_can(tmp_path, monkeypatch):
    """The entrypoint starts FlashAttention-4's import check before the model's shape is read
    (early_import_check); measure keeps it where a GPU could run FlashAttention-4, and stops it here (CPU)."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert m.early_import_check("sdpa") is None  # SFT_ATTENTION rules FlashAttention-4 out
    early = m.ImportCheck.start("slow_to_import")
    began = time.monotonic()
    facts = m.measure(str(tmp_path / "out"), early=early)
    assert facts.import_check is None and early.child.returncode is not None  # stopped, not waited out
    assert time.monotonic() - began < 30


def test_refused_settings_stop_the_early_import_check(tmp_path):
    """The entrypoint starts FlashAttention-4's import check before it reads the settings' inputs; when it refuses
    them (exit 2), the check's child is gone too. flash-attn-4 stands in as a package that imports for a minute."""
    import os
    import signal

    from conftest import demo_env, run_entrypoint

    for package in ("flash_attn", "flash_attn/cute", "cutlass"):
        (tmp_path / "site" / package).mkdir(parents=True)
        (tmp_path / "site" / package / "__init__.py").write_text("")
    (tmp_path / "site" / "flash_attn" / "cute" / "__init__.py").write_text(
        f"import time\nopen({str(tmp_path / 'began')!r}, 'w').close()\ntime.sleep(60)\n")

    def children() -> list[int]:  # processes importing the stand-in, by their command lines
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                line = open(f"/proc/{pid}/cmdline", "rb").read()
                ours = b"import flash_attn.cute" in line and str(tmp_path).encode() in open(
                    f"/proc/{pid}/environ", "rb").read()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if ours:
                found.append(int(pid))
        return found

    # a dataset that is not there; the demo model's shape is still read (a second or more: torch and
    # Transformers' imports), time in which the started child imports the stand-in
    env = demo_env(tmp_path, dataset=str(tmp_path / "missing.jsonl"), attention="auto")
    env["PYTHONPATH"] = str(tmp_path / "site")
    result = run_entrypoint(env, "probe", timeout=120)
    try:
        assert result.returncode == 2 and "SFT_DATASET" in result.stderr, result.stderr
        assert (tmp_path / "began").exists()  # it was started: the stand-in ran
        assert children() == []
    finally:
        for pid in children():
            os.kill(pid, signal.SIGKILL)


def test_the_job_counts_from_its_process_start():
    """process_started_at: the process's start from /proc, so what ran before the job's code counts."""
    import subprocess
    import sys

    from conftest import REPO

    code = ("import time; time.sleep(1.5); from sft.controller.machine import process_started_at; "
            "print(time.time() - process_started_at())")
    waited = float(subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout)
    assert 1.5 <= waited < 60


def test_a_machine_that_fails_several_checks_at_once():
    facts = m.Facts(Machine(gpus=(GPU("NVIDIA H200", 139 * GIB),) * 2, host_memory_bytes=8 * GIB,
                            memlock_bytes=64 * 1024), "/out", nvcc=None, torch_cuda="13.0",
                    cpu_adam=(True, False, False), shm_bytes=64 * 2**20, free_disk_bytes=10**9)
    needs = pf.Needs(gpus=4, offload=True, host_bytes=100 * GIB, total_params=QWEN3_8B_PARAMS, save_total_limit=2)
    failed = {c.name for c in pf.failed(pf.run(facts, needs))}
    assert failed == {"gpus", "nvcc", "shm", "host_memory", "disk"}
    memlock = next(c for c in pf.run(facts, needs) if c.name == "memlock")
    assert memlock.status == "warn" and memlock.data == {"pin_memory": False}


def test_failed_lists_only_failures():
    checks = [pf.Check("a", "ok", "fine"), pf.Check("b", "fail", "broken: fix it"), pf.Check("c", "warn", "slow")]
    assert [c.name for c in pf.failed(checks)] == ["b"]
    assert pf.format_checks(checks).splitlines()[1] == "[fail] b  broken: fix it"
