"""Shared fixtures: an isolated environment and the real entrypoint as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = REPO / "demo" / "tiny-qwen3"
DEMO_DATA = REPO / "demo" / "chat.jsonl"
# Read by the job to find the other nodes: a test run inside a SLURM or torchrun job must not inherit them.
NODE_VARS = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "PET_", "SLURM_")


def clean_environ(tmp_path: Path) -> dict[str, str]:
    """The test process's environment without any SFT_* or Hub variable, caches under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SFT_", "HF_", "HUGGING", *NODE_VARS))}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    return env


@pytest.fixture
def crc32_off():
    """torch.save without a CRC32 of each record, as the ranks save (ranks/patches/checkpoints.py)."""
    from torch.utils.serialization import config

    before = config.save.compute_crc32
    config.save.compute_crc32 = False
    yield
    config.save.compute_crc32 = before


@pytest.fixture
def isolated_env(monkeypatch, tmp_path):
    """Every variable the job reads, cleared for this test (the job reads os.environ directly)."""
    for key in list(os.environ):
        if key.startswith(("SFT_", "HF_", "HUGGING", *NODE_VARS)):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    go_offline(monkeypatch)
    return tmp_path


@pytest.fixture
def offline(monkeypatch):
    """No Hub from this test's process (go_offline)."""
    go_offline(monkeypatch)


def go_offline(monkeypatch) -> None:
    """No Hub from this process. huggingface_hub reads HF_HUB_OFFLINE once, when first imported: where an earlier
    test of this process imported it without the variable, a Hub name went to the network, each lookup retried with
    backoff (test_fuzz took 210 s instead of 10 after test_labels). The job's processes read it at their start."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def demo_env(tmp_path: Path, **settings: object) -> dict[str, str]:
    """An environment that runs the job on the demo model and data, with SFT_* overrides."""
    env = clean_environ(tmp_path)
    env.update(SFT_MODEL=str(DEMO_MODEL), SFT_DATASET=str(DEMO_DATA), SFT_OUTPUT_DIR=str(tmp_path / "out"))
    env.update({f"SFT_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def without_pad_token(folder: Path) -> Path:
    """A copy of the demo model whose tokenizer has no pad token (as many base models' have none)."""
    shutil.copytree(DEMO_MODEL, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def run_entrypoint(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python entrypoint.py ARGS` exactly as the image runs it, output captured."""
    return subprocess.run([sys.executable, str(REPO / "entrypoint.py"), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def read_summary(out: Path) -> dict:
    return json.loads((out / "run" / "summary.json").read_text())


def step_losses(summary: dict) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in summary["train"]["log_history"] if "loss" in e}


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """A real filesystem of `size` (tmpfs) mounted at folder, for a disk that fills; the test skips, with the
    reason, where mounting is not allowed (not root)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=False,
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'mount refused'} (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and every process under it, parents first ([] once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def send_signal(procs: list[psutil.Process], sig: int) -> None:
    """`sig` to each of them, skipping any that already exited."""
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


FUZZ_REPORT: list[str] = []  # tests/test_fuzz.py's groups: their examples and time, said at the end of the run


def pytest_terminal_summary(terminalreporter):
    for line in FUZZ_REPORT:
        terminalreporter.write_line(line)
