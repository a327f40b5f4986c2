"""Pytest fixtures and helpers around the local Hub server (the package tests/hubserver/).

Use them from a test module or a conftest.py:

    from hub_fixtures import hub_api, hub_server  # noqa: F401  (pytest fixtures)

* ``hub_server``: a started in-process ``HubServer`` on a fresh root, with the already-imported
  huggingface_hub pointed at it for the duration of the test (see ``configure_client``).
* ``hub_api``: an ``HfApi`` on that server with the write token.
* ``hub_process``: the server as a separate process (``python -m hubserver``), steered over
  HTTP through a ``HubProcess``; what a test of the product's container or CLI needs, together
  with ``client_env(url, hf_home)`` for the environment of the process under test.
* ``not_yet(predicate)``: one poll of a wait on the server's state, where a repo or branch that does
  not exist yet reads as False instead of an error.

Tokens: ``hubserver.WRITE_TOKEN`` (alice, write) and ``hubserver.READ_TOKEN`` (alice, read).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hubserver import READ_TOKEN, WRITE_TOKEN, HubError, HubServer  # noqa: E402

TESTS = Path(__file__).resolve().parent  # holds the hubserver package

__all__ = [
    "READ_TOKEN", "WRITE_TOKEN", "HubProcess", "client_env", "configure_client",
    "hub_api", "hub_process", "hub_server", "not_yet", "start_hub_process",
]  # fmt: skip

# What reading the server's store raises for a repo, or a branch of it, that does not exist.
MISSING = ("RepoNotFound", "RevisionNotFound")


def not_yet(predicate):
    """`predicate()` for one poll of a wait on the Hub's state: False while the repo or its branch is missing.

    A wait can begin before what it polls exists: the job creates its repo only once it has started,
    and the server writes a new repo's metadata before its first commit gives it a `main` branch. Those
    reads fail with RepoNotFound or RevisionNotFound, which means "not yet" to a wait, not an error;
    any other error still ends it.
    """
    try:
        return predicate()
    except HubError as err:
        if err.code in MISSING:
            return False
        raise


def client_env(endpoint: str, hf_home, etag_timeout: int = 3) -> dict[str, str]:
    """Environment for a process that runs huggingface_hub against the local server.

    huggingface_hub reads these at import time, so they must be in the environment of the
    process before it imports the library (a subprocess or a container).
    """
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "0",  # other tests (and `make demo`) run with HF_HUB_OFFLINE=1
        "HF_HUB_DISABLE_TELEMETRY": "1",  # also stops the agent-registry fetch to constants.ENDPOINT
        "HF_HUB_DISABLE_XET": "1",  # with hf_xet installed, uploads would otherwise be Xet-only
        "HF_HUB_ETAG_TIMEOUT": str(etag_timeout),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    }


def configure_client(monkeypatch, endpoint: str, hf_home, etag_timeout: int = 3) -> None:
    """Point an already-imported huggingface_hub at `endpoint` for the current test.

    Setting the environment is not enough once the library is imported: its constants were read
    at import time. So patch the constants too (undone by monkeypatch after the test).
    """
    import huggingface_hub.hf_api
    from huggingface_hub import constants

    for name, value in client_env(endpoint, hf_home, etag_timeout).items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    home = str(hf_home)
    patches = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": home,
        "HF_HUB_CACHE": os.path.join(home, "hub"),
        "HUGGINGFACE_HUB_CACHE": os.path.join(home, "hub"),
        "HF_ASSETS_CACHE": os.path.join(home, "assets"),
        "HF_XET_CACHE": os.path.join(home, "xet"),
        "HF_TOKEN_PATH": os.path.join(home, "token"),
        "HF_STORED_TOKENS_PATH": os.path.join(home, "stored_tokens"),
        "AGENT_HARNESSES_PATH": os.path.join(home, ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,  # read at import: the session may have imported it offline
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_ETAG_TIMEOUT": etag_timeout,
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value)
    # The module-level helpers (huggingface_hub.upload_folder, ...) use this instance.
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", endpoint)
    # What HF_HUB_DISABLE_PROGRESS_BARS=1 gives. huggingface_hub.utils (2.4.0) is a lazy facade:
    # the huggingface_hub.utils.tqdm submodule is only imported when something first needs it, so
    # it may not be in sys.modules yet (it is not after `import huggingface_hub.hf_api` alone); and
    # the attribute `huggingface_hub.utils.tqdm` is the tqdm class, not the module. import_module
    # both loads the submodule and returns the module itself.
    tqdm_module = importlib.import_module("huggingface_hub.utils.tqdm")
    monkeypatch.setattr(tqdm_module, "progress_bar_states", {"_global": False})


@pytest.fixture
def hub_server(tmp_path, monkeypatch):
    """A fresh in-process HubServer, with huggingface_hub pointed at it."""
    from huggingface_hub.utils import close_session

    server = HubServer(tmp_path / "hub").start()
    configure_client(monkeypatch, server.url, tmp_path / "hf_home")
    yield server
    server.stop()
    close_session()  # drop pooled connections to the stopped server


@pytest.fixture
def hub_api(hub_server):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_server.url, token=WRITE_TOKEN)


# --------------------------------------------------------------------------------------------
# The server as a separate process
# --------------------------------------------------------------------------------------------


class HubProcess:
    """A hubserver process, steered through its /_test/ HTTP routes (stdlib only)."""

    def __init__(self, proc: subprocess.Popen, url: str, output_file: Path):
        self.proc, self.url, self.output_file = proc, url, output_file

    def output(self) -> str:
        """What the server printed (stdout and stderr)."""
        return self.output_file.read_text()

    def control(self, method: str, route: str, body=None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + route, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def add_fault(self, kind: str = "status", **fields) -> int:
        return self.control("POST", "/_test/faults", {"kind": kind, **fields})["ids"][0]

    def faults(self) -> list[dict]:
        return self.control("GET", "/_test/faults")["faults"]

    def request_log(self) -> list[dict]:
        return self.control("GET", "/_test/log")["requests"]

    def add_token(self, token: str, user: str, role: str = "write") -> None:
        self.control("POST", "/_test/tokens", {"token": token, "user": user, "role": role})

    def reset(self) -> None:
        self.control("POST", "/_test/reset", {})

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout)


def start_hub_process(root, args=(), timeout: float = 20, python: str = sys.executable) -> HubProcess:
    """Start `python -m hubserver --port 0` and wait for the port it picked."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port_file, output_file = root / "hubserver.port", root / "hubserver.out"
    port_file.unlink(missing_ok=True)
    cmd = [python, "-m", "hubserver", "--port", "0", "--root", str(root), "--port-file", str(port_file)]
    # -m finds the package through PYTHONPATH whatever the working directory is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    with open(output_file, "w") as output:  # a file, not a pipe: nobody has to drain it
        proc = subprocess.Popen([*cmd, *args], stdout=output, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"hubserver did not start: {output_file.read_text()}")
        time.sleep(0.05)
    return HubProcess(proc, f"http://127.0.0.1:{int(port_file.read_text())}", output_file)


@pytest.fixture
def hub_process(tmp_path):
    """The hubserver in its own process; yields a HubProcess."""
    process = start_hub_process(tmp_path / "hub-process")
    yield process
    process.stop()
