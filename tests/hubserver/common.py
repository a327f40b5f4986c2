"""What every part of the server shares: the default tokens, the Hub's limits and URL shapes, the
error that becomes an HTTP answer, and small helpers for paths, dates and headers."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone

WRITE_TOKEN = "hf_writetoken_alice_0123456789abcdef"
READ_TOKEN = "hf_readtoken_alice_0123456789abcdef"
DEFAULT_TOKENS = {
    WRITE_TOKEN: {"user": "alice", "role": "write"},
    READ_TOKEN: {"user": "alice", "role": "read"},
}

# The Hub stores files larger than 10 MB with LFS (and refuses them as regular git blobs).
LFS_THRESHOLD = 10 * 1024 * 1024
REPO_TYPES = {"model": "models", "dataset": "datasets"}  # API singular -> URL plural
URL_PREFIX = {"models": "", "datasets": "datasets/"}  # prefix of /resolve and .git URLs

# The .gitattributes the Hub puts in every new repo (abridged): these files always go through LFS.
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack"
        " *.npy *.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors"
        " saved_model/**/* *.tar.* *.tar *.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents*"
    ).split()
)

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"
CHUNK = 1024 * 1024


class HubError(Exception):
    """An error answered to the client: JSON {"error": message} plus the Hub's X-Error-* headers."""

    def __init__(self, status: int, message: str, code: str | None = None, headers=None, extra=None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def git_blob_oid(data: bytes) -> str:
    """The git object id of a blob (what `git hash-object` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _clean_repo_path(path) -> str:
    """Validate a path inside a repo; the Hub refuses absolute paths, '..' and .git/."""
    if not isinstance(path, str) or not path.strip("/"):
        raise HubError(400, f"Invalid path: {path!r}")
    parts = path.strip("/").split("/")
    if any(part in ("", ".", "..", ".git") for part in parts):
        raise HubError(400, f"Invalid path: {path!r}")
    return "/".join(parts)


def _header_value(text: str) -> str:
    """`text` as one line of ASCII: safe in an HTTP header (a newline would end the header)."""
    return " ".join(str(text).split()).encode("ascii", "replace").decode()
