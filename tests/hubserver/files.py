"""File downloads: ``GET|HEAD /[datasets/]{ns}/{name}/resolve/{rev}/{path}``, with the headers
hf_hub_download reads (ETag, X-Repo-Commit, X-Linked-Etag/-Size for LFS files) and byte ranges."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from .common import CHUNK, HubError


class FileAPI:
    """The resolve endpoint, mixed into the request handler."""

    def h_resolve(self, m) -> None:
        """Download a file; HEAD gives the metadata hf_hub_download needs."""
        rtype = "datasets" if m["prefix"] else "models"
        repo_id = m["repo_id"]
        self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        path = unquote(m["path"])
        entry = files.get(path)
        if entry is None:  # X-Repo-Commit lets the client cache the non-existence
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "ETag": f'"{entry["oid"]}"'}
        if entry["lfs"]:
            headers.update({"ETag": f'"{entry["sha256"]}"', "X-Linked-Etag": f'"{entry["sha256"]}"',
                            "X-Linked-Size": str(entry["size"])})  # fmt: skip
        self._send_file(self.hub.store.blob_path(entry["sha256"]), entry["size"], headers)

    def _send_file(self, blob: Path, size: int, headers: dict) -> None:
        start, end, status = 0, size - 1, 200
        range_header = self.headers.get("Range")
        if range_header:
            match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", range_header)
            if not match or match.groups() == ("", ""):
                raise HubError(416, f"Unsupported Range: {range_header}", headers={"Content-Range": f"bytes */{size}"})
            first, last = match.groups()
            start, end = (int(first), int(last or size - 1)) if first else (max(0, size - int(last)), size - 1)
            end = min(end, size - 1)
            if start > end:
                raise HubError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._start(status, headers, end - start + 1, "application/octet-stream")
        if self.command == "HEAD":
            return
        with open(blob, "rb") as f:
            f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                data = f.read(min(CHUNK, remaining))
                self._write(data)
                remaining -= len(data)
