"""How the job's Hub traffic travels: Git LFS, the protocol every test of this project runs, not Xet.

huggingface_hub 2.4.0 sends every upload through Xet whenever hf_xet is installed (it is: huggingface_hub
depends on it), without asking the server; its documented switch back to Git LFS is HF_HUB_DISABLE_XET=1.
The Hub keeps LFS for clients without Xet: an LFS upload into a Xet-backed repo is moved into Xet storage
by the Hub itself, and downloads come through its LFS bridge. So the job sets HF_HUB_DISABLE_XET=1 unless
the user set it, because:
  - what users rely on (a checkpoint counts on the Hub only with its manifest, the flush before exit 143,
    a resume from a verified download) is tested end to end against tests/hubserver/, which speaks LFS;
    the Xet path (hf_xet's Rust client, its own retries and threads) is tested by nothing here;
  - what Xet adds does not apply to checkpoints: its chunk deduplication finds nothing to share between
    two of them (every weight and optimizer byte changes between saves), and the sha256 that LFS needs is
    the manifest's, hashed once for both (sft/hub/manifest.py).
What it costs: the model and data downloads go through the LFS bridge too, not hf_xet's parallel chunks.
huggingface_hub reads the variable when it is imported: set it before that; the ranks inherit it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import MutableMapping

VARIABLE = "HF_HUB_DISABLE_XET"
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of a boolean variable (constants._is_true)


def choose(environ: MutableMapping[str, str] = os.environ) -> None:
    """Git LFS, unless the user set HF_HUB_DISABLE_XET themselves (then theirs stands, and the log says so)."""
    environ.setdefault(VARIABLE, "1")


def describe(environ: MutableMapping[str, str] = os.environ) -> str:
    """Which protocol uploads take, for the log line that names the repo."""
    if environ.get(VARIABLE, "").upper() in TRUE:
        return "through Git LFS"
    if importlib.util.find_spec("hf_xet") is None:
        return "through Git LFS (hf_xet is not installed)"
    return (f"through Xet ({VARIABLE}={environ.get(VARIABLE, '')!r}: hf_xet's path, which this image's tests "
            f"do not run; unset it for Git LFS)")
