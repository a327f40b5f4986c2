"""How the job's Hub traffic travels: downloads through Xet, uploads through Git LFS, the protocol every test of
this project runs.

huggingface_hub 2.4.0 sends every upload through Xet whenever hf_xet is installed (it is: huggingface_hub
depends on it), without asking the server; it downloads a file through Xet where the repo stores it there (the
server says so in its answer), else over HTTP. Its documented switch for both is HF_HUB_DISABLE_XET, read once,
when huggingface_hub is imported, into the constant that `is_xet_available()` reads at every call.

Downloads (the base model in the ranks, the data and a checkpoint to resume in the controller) take Xet: hf_xet's
parallel chunks, the library's default, the fastest way from the Hub. Uploads take Git LFS: `for_uploads` sets
that constant in the controller before its uploader starts (the one upload path of the job), because:
  - what users rely on (a checkpoint counts on the Hub only with its manifest, the flush before exit 143,
    a resume from a verified download) is tested end to end against tests/hubserver/, which speaks LFS;
    the Xet upload path (hf_xet's Rust client, its own retries and threads) is tested by nothing here;
  - what Xet adds does not apply to checkpoints: its chunk deduplication finds nothing to share between
    two of them (every weight and optimizer byte changes between saves), and the sha256 that LFS needs is
    the manifest's, hashed once for both (sft/hub/manifest.py). The Hub moves LFS uploads into Xet itself.
Set by hand rather than through the variable: the variable would turn Xet off for the downloads too, since
huggingface_hub reads it once. A user's own HF_HUB_DISABLE_XET stands for both (1: LFS, 0: Xet).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Mapping

VARIABLE = "HF_HUB_DISABLE_XET"
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of a boolean variable (constants._is_true)


def for_uploads(environ: Mapping[str, str] = os.environ) -> None:
    """Git LFS for this process's uploads from now on, unless the user set HF_HUB_DISABLE_XET themselves. Called
    before the uploader starts: the downloads of the start (model, data, a checkpoint to resume) are over."""
    if VARIABLE not in environ:
        from huggingface_hub import constants

        constants.HF_HUB_DISABLE_XET = True  # what HF_HUB_DISABLE_XET=1 sets at import (is_xet_available reads it)


def describe(environ: Mapping[str, str] = os.environ) -> str:
    """Which protocol uploads take, for the log line that names the repo."""
    if VARIABLE not in environ or environ[VARIABLE].upper() in TRUE:
        return "through Git LFS"
    if importlib.util.find_spec("hf_xet") is None:
        return "through Git LFS (hf_xet is not installed)"
    return (f"through Xet ({VARIABLE}={environ[VARIABLE]!r}: hf_xet's path, which this image's tests do not run; "
            f"unset it for Git LFS)")
