"""A local stand-in for the Hugging Face Hub HTTP API, for tests.

Standard library only, so it also runs inside a minimal container:

    PYTHONPATH=tests python -m hubserver --port 0 --root /tmp/hub [--port-file /tmp/hub.port] \
        [--token hf_xxx=alice:write] [--tokens-file tokens.json] [--verbose]

or from Python:

    server = HubServer(root, tokens={"hf_w": {"user": "alice", "role": "write"}}).start()
    api = HfApi(endpoint=server.url, token="hf_w")
    ...
    server.stop()

The protocol was taken from the real client (huggingface_hub 2.4.0, httpx2 transport); it is not a
full Hub, only what an upload/download client of model (and dataset) repos needs.

The parts, each readable on its own:
  server.py     HubServer: start/stop, tokens, faults, request log, LFS upload tickets
  cli.py        the command line (``python -m hubserver``)
  store.py      RepoStore: repos, commits and file contents on disk
  handler.py    the routes (the list of endpoints) and the life of a request
  transport.py  request bodies and answers on a keep-alive connection
  faults.py     fault injection, and what the client retries by itself
  control.py    the /_test/ routes that steer a server in another process
  account.py    tokens and permissions, /api/whoami-v2
  repos.py      create, delete, info, settings, refs, commit history
  commits.py    preupload and commit
  lfs.py        the LFS batch API, upload and verify
  trees.py      tree listings and paths-info
  files.py      file downloads (/resolve)
  cards.py      model card metadata (/api/validate-yaml)
  common.py     shared constants, HubError and small helpers

Findings about the client configuration
---------------------------------------
* Xet: with ``hf_xet`` installed (it is, hf-xet 1.8.0), 2.4.0 uploads *only* through Xet: both
  ``create_commit`` (``_upload_files``) and ``upload_folder`` (``pipelined_upload``) take the Xet
  path whenever ``is_xet_available()``; there is no server-side negotiation and no fallback to LFS.
  The only switch is ``HF_HUB_DISABLE_XET=1`` (read into ``constants.HF_HUB_DISABLE_XET`` at import;
  ``is_xet_available()`` reads the constant at call time, so patching the constant also works).
  With it set, uploads use the preupload + LFS batch + basic PUT protocol served here. This server
  answers the Xet token routes with 501 so a client left on Xet fails loudly. Downloads only use
  Xet when the HEAD response carries ``X-Xet-Hash``, which this server never sends.
* HF_ENDPOINT: ``HfApi(endpoint=...)``, ``hf_hub_download(endpoint=...)`` and
  ``snapshot_download(endpoint=...)`` are enough for every Hub call they make, but several things
  are fixed at import time from the environment: ``constants.ENDPOINT`` (used by the module-level
  helpers such as ``huggingface_hub.upload_folder`` through the default ``HfApi()`` instance, by
  ``HUGGINGFACE_CO_URL_TEMPLATE``, telemetry and the agent-harness registry fetch), HF_HOME/cache
  paths, ``HF_HUB_DISABLE_XET``, ``HF_HUB_ETAG_TIMEOUT`` and ``HF_HUB_DISABLE_TELEMETRY``. Without
  ``HF_HUB_DISABLE_TELEMETRY=1`` the first request of a process builds a user agent that fetches
  ``{constants.ENDPOINT}/api/agent-harnesses`` (i.e. https://huggingface.co unless HF_ENDPOINT was
  set before import). So: code under test that uses the module-level functions or ``HfApi()``
  without ``endpoint=`` must get HF_ENDPOINT (and the other variables) in its environment before
  it imports huggingface_hub, e.g. run it in a subprocess; in-process tests pass ``endpoint=`` and
  patch the constants (see tests/hub_fixtures.py).
"""

from .account import Principal
from .cards import validate_card_metadata
from .cli import main
from .common import (
    DEFAULT_TOKENS,
    LFS_THRESHOLD,
    READ_TOKEN,
    REPO_TYPES,
    URL_PREFIX,
    WRITE_TOKEN,
    HubError,
    git_blob_oid,
)
from .faults import Fault, FaultInjector
from .server import HubServer
from .store import RepoStore

__all__ = [
    "DEFAULT_TOKENS", "LFS_THRESHOLD", "READ_TOKEN", "REPO_TYPES", "URL_PREFIX", "WRITE_TOKEN",
    "Fault", "FaultInjector", "HubError", "HubServer", "Principal", "RepoStore",
    "git_blob_oid", "main", "validate_card_metadata",
]  # fmt: skip
