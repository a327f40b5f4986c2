"""The ranks started before the decision (controller/standby.py, sft/ranks/standby.py): the job's first launch
takes them over, a start refused before ends them leaving nothing behind, a process told to end says nothing, and
what the imports printed is said once the spec comes, in its place in the log."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEMO_MODEL, REPO, clean_environ, demo_env, read_summary
from test_attention_ahead import spec_of

from sft.controller import launch, standby
from sft.handoff import StandbyFolder, lock_held
from sft.nodes import Nodes
from sft.planner.inputs import Ranks
from sft.ranks import attention_ahead
from sft.settings import Settings


def processes_naming(text: str, within: float = 0) -> list[str]:
    """The command lines of the processes running now that contain `text`; with `within`, those still running
    after up to that many seconds (a rank spawned as its launcher was killed ends after its imports)."""
    deadline = time.monotonic() + within
    while (found := _processes_naming(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if text in line:
            found.append(line)
    return found


def run_watching(env: dict[str, str], tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The entrypoint to its end, with TMPDIR=tmp; the standby folders seen in tmp while it ran."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**env, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, str(REPO / "entrypoint.py"), *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    while proc.poll() is None:
        seen |= {p.name for p in tmp.glob("sft-standby-*")}
        time.sleep(0.05)
    out = proc.stdout.read()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, ""), seen


def test_the_first_launch_takes_the_standby_over(tmp_path):
    result, seen = run_watching(demo_env(tmp_path, probe_steps=3, max_length=64), tmp_path / "tmp", "probe")
    assert result.returncode == 0, result.stdout[-3000:]
    launches = [line for line in result.stdout.splitlines() if "$ " in line]
    assert len(launches) == 1 and f"-m {standby.PROGRAM} {launch.RANK_PROGRAM} {tmp_path / 'tmp'}" in launches[0]
    assert "standby: the ranks above started" in result.stdout
    assert "standby: rank 0 imported its libraries" in result.stdout
    assert read_summary(tmp_path / "out")["probe"]["steps"] == 3
    assert len(seen) == 1 and not list((tmp_path / "tmp").glob("sft-standby-*"))  # its folder went with the job
    # what the ranks' imports print (DeepSpeed's accelerator, on CPU) comes after the launch's line, not before
    warnings = [i for i, line in enumerate(result.stdout.splitlines()) if "Setting accelerator to CPU" in line]
    where = result.stdout.splitlines().index(launches[0])
    assert sum(i > where for i in warnings) >= 2, result.stdout[:4000]


@pytest.mark.parametrize("case", ["data", "inputs"])
def test_a_start_refused_ends_the_standby_and_leaves_nothing(tmp_path, case):
    """The settings are valid, so the standby starts; what they name is refused (a model whose config.json does not
    parse, checked before the job begins; a bad row, found by the job's data read): its processes end, unseen, and
    its folder goes."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "bot", "content": "hi"}]}\n')
    (model := tmp_path / "model").mkdir()
    (model / "config.json").write_text("{not json")
    env = demo_env(tmp_path, **({"dataset": bad} if case == "data" else {"model": model}))
    result, seen = run_watching(env, tmp_path / "tmp")
    assert result.returncode == 2, result.stdout[-3000:]
    assert len(seen) == 1, "the standby never started: this test would not see it end"
    assert not processes_naming(str(tmp_path / "tmp"), within=60)
    assert not list((tmp_path / "tmp").glob("sft-standby-*"))
    assert "$ " not in result.stdout and "standby" not in result.stdout and not (tmp_path / "out").exists()
    assert result.stdout.count("Setting accelerator to CPU") <= 1  # the controller's own; the ranks' imports: unsaid


@pytest.mark.parametrize("how", ["ended", "died"])
def test_a_process_whose_controller_is_gone_ends_having_said_nothing(tmp_path, how):
    """Its controller gone before any Start: ended (its folder removed) or died (its lock freed by the kernel; it
    may have died as its launcher was spawning the ranks, before a rank could set its death signal). The process
    exits 0 after its imports, removes what they made in the folder, and what they printed (DeepSpeed's
    accelerator warning, on CPU) is not said."""
    folder = StandbyFolder(tmp_path / "standby")
    folder.path.mkdir()
    alive = os.open(folder.controller, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(alive, fcntl.LOCK_EX)  # the controller's, as controller/standby.py holds it
    env = {**clean_environ(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(folder.cache / "inductor")}
    proc = subprocess.Popen([sys.executable, "-m", standby.PROGRAM, launch.RANK_PROGRAM, str(folder.ranks)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    if how == "ended":
        shutil.rmtree(folder.path)  # as Standby.end: its imports make the cache's folder again after this
    os.close(alive)  # its lock, free (at a death, the kernel frees it)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, "", "") and not folder.path.exists()
    imports = subprocess.run([sys.executable, "-c", "import deepspeed"], cwd=REPO, env=clean_environ(tmp_path),
                             capture_output=True, text=True)
    assert "Setting accelerator to CPU" in imports.stdout + imports.stderr  # what was held back, unsaid


def test_a_process_waits_while_its_controller_lives(tmp_path):
    folder = StandbyFolder(tmp_path / "standby")
    folder.path.mkdir()
    alive = os.open(folder.controller, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(alive, fcntl.LOCK_EX)
    try:
        assert folder.waits()
    finally:
        os.close(alive)
    assert not folder.waits()
    folder.controller.unlink()
    assert not folder.waits()


def test_what_the_imports_printed_is_said_after_the_spec_in_order(tmp_path):
    code = ("import os\nfrom sft.ranks.standby import held_output, say\nprint('first', flush=True)\n"
            "with held_output() as h:\n    print('held out')\n    os.write(2, b'held err\\n')\n"
            "print('between', flush=True)\nsay(h)\nprint('last')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert (result.stdout, result.stderr) == ("first\nbetween\nheld out\nlast\n", "held err\n")


@pytest.mark.parametrize("wanted", [True, False])
def test_flash_attention_4s_process_waits_holding_its_lock_and_runs_the_spec_or_is_killed(tmp_path, capfd, wanted):
    """Its lock held from before it starts, and named by the spec the ranks run; handed a spec with FlashAttention-4,
    it runs attention_ahead as a launch's process would (here it fails to find CUDA and says so); handed one
    without, it is killed unseen. The lock is free after either. (CPU ranks stand in for the GPU's here.)"""
    waiting = standby.Standby(Settings(model=str(DEMO_MODEL), output_dir=str(tmp_path / "out")), Ranks(1, ()),
                              kernels_ahead=True)
    proc = None
    try:
        assert waiting.ahead is not None and lock_held(waiting.folder.lock)
        assert attention_ahead.wait(str(waiting.folder.lock), timeout_s=0.3) >= 0.3  # a rank waits for it
        spec = waiting.spec(spec_of(tmp_path) if wanted else dataclasses.replace(spec_of(tmp_path), attention_lock=""))
        assert spec.attention_lock == (str(waiting.folder.lock) if wanted else "")
        proc, ahead = waiting.hand_over(spec.save(tmp_path / "spec.json"), spec, clean_environ(tmp_path))
        assert ahead is (waiting.ahead if wanted else None)
        assert waiting.ahead.wait(timeout=120) == (1 if wanted else -9) and not lock_held(waiting.folder.lock)
        out = capfd.readouterr().out
        said = "FlashAttention-4's kernels were not compiled ahead"
        assert said in out if wanted else said not in out
    finally:
        if proc is not None:
            launch._signal_group(proc, signal.SIGKILL)  # the ranks were handed a GPU's spec: not run here
            proc.wait()
        waiting.end()


def test_a_standby_for_other_ranks_is_not_taken(tmp_path):
    ranks = Ranks(count=1, gpus=())
    waiting = standby.Standby(Settings(model=str(DEMO_MODEL), output_dir=str(tmp_path / "out")), ranks)
    assert waiting.ahead is None  # not asked for
    try:
        assert waiting.fits(ranks) and not waiting.fits(Ranks(count=2, gpus=()))
    finally:
        waiting.end()
    assert not waiting.folder.path.exists() and waiting.proc.returncode is not None
    assert not processes_naming(str(waiting.folder.path), within=60)  # the ranks went with their launcher
    assert not waiting.fits(ranks)  # ended


def test_no_standby_across_nodes(tmp_path):
    """Each node's ranks start when node 0 says (controller/coordinate.py)."""
    s = Settings(output_dir=str(tmp_path / "out"))
    assert standby.start(s, Ranks(2, (), nodes=2), Nodes(2, 0, "10.0.0.1", 29500), ()) is None


def test_the_folders_the_imports_made_before_the_start_are_made_in_the_output_folders_cache(tmp_path):
    """torch._dynamo and FlashAttention-4 make their caches' folders at import and keep the paths: made before the
    Start in the standby's own folder, they are made again where the link points after it: the output folder's cache."""
    from sft.ranks.standby import made_again

    folder = StandbyFolder(tmp_path / "standby")
    (folder.cache_before_start / "flash-attention" / "abc123" / "fwd").mkdir(parents=True)
    (folder.cache_before_start / "inductor" / "dynamo").mkdir(parents=True)
    (real := tmp_path / "out" / "run" / "compile-cache").mkdir(parents=True)
    folder.cache.symlink_to(real)
    made_again(folder)
    assert (real / "flash-attention" / "abc123" / "fwd").is_dir() and (real / "inductor" / "dynamo").is_dir()


def test_a_killed_controllers_folder_is_removed_by_the_next_standby(tmp_path):
    """SIGKILL leaves a controller no time to remove its folder: the next standby removes a folder whose lock no live
    process holds, once older than a starting controller's could be; not a live controller's, nor a young one."""
    tmp = tmp_path / "tmp"
    killed, live, young = (StandbyFolder(tmp / (standby.FOLDER_PREFIX + name)) for name in ("killed", "live", "young"))
    for folder in (killed, live, young):
        folder.path.mkdir(parents=True)
        folder.controller.touch()
        folder.cache.symlink_to(tmp_path)
    alive = os.open(live.controller, os.O_WRONLY)
    fcntl.flock(alive, fcntl.LOCK_EX)
    long_ago = time.time() - standby.ABANDONED_AFTER_SECONDS - 5
    for folder in (killed, live):
        os.utime(folder.path, (long_ago, long_ago))
    try:
        standby.remove_abandoned(tmp)
        assert sorted(p.name for p in tmp.iterdir()) == [live.path.name, young.path.name]
    finally:
        os.close(alive)
    assert tmp_path.is_dir()  # the link was removed, not what it points to
