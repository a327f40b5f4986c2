"""Commits: ``POST .../preupload/{rev}`` (which files go as base64 in the commit, which through LFS)
and ``POST .../commit/{rev}`` (NDJSON: header, file, lfsFile, deletedFile, deletedFolder)."""

from __future__ import annotations

import base64
import fnmatch
import json
from urllib.parse import unquote

from .common import URL_PREFIX, HubError, _clean_repo_path, _truthy


def _lfs_patterns(gitattributes: str) -> list[str]:
    """The patterns of a .gitattributes file that have `filter=lfs`."""
    patterns = []
    for line in gitattributes.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and "filter=lfs" in fields[1:]:
            patterns.append(fields[0])
    return patterns


def _matches_any(path: str, patterns: list[str]) -> bool:
    """Approximate gitattributes matching: a pattern without '/' matches the basename anywhere."""
    basename = path.rsplit("/", 1)[-1]
    for pattern in patterns:
        if "/" in pattern.strip("/"):
            if fnmatch.fnmatchcase(path, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(basename, pattern):
            return True
    return False


class CommitAPI:
    """The preupload and commit endpoints, mixed into the request handler."""

    def h_preupload(self, m) -> None:
        """Tell the client which files go as base64 in the commit and which through LFS."""
        rtype, repo_id = m["rtype"], m["repo_id"]
        body = self._json_body()
        self._writable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        gitattributes = files.get(".gitattributes")
        patterns = _lfs_patterns(
            self.hub.store.blob_path(gitattributes["sha256"]).read_text() if gitattributes else ""
        )
        answers = []
        for item in body.get("files") or []:
            path = _clean_repo_path(item.get("path"))
            sample = base64.b64decode(item.get("sample") or "")
            lfs = (
                int(item.get("size") or 0) > self.hub.lfs_threshold
                or _matches_any(path, patterns)
                or b"\0" in sample  # binary content is never stored as a regular git blob
            )
            existing = files.get(path)
            oid = (existing["sha256"] if existing["lfs"] else existing["oid"]) if existing else None
            answers.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular",
                            "shouldIgnore": False, "oid": oid})  # fmt: skip
        self._json({"files": answers, "commitOid": sha})

    def h_commit(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        if _truthy(self.query.get("create_pr", ["0"])[0]):
            raise HubError(400, "Pull requests are not supported by this local hub")
        lines = [line for line in self._read_body().splitlines() if line.strip()]
        p, _ = self._writable(rtype, repo_id)
        try:
            items = [json.loads(line) for line in lines]
        except ValueError:
            raise HubError(400, "Commit payload is not valid NDJSON") from None
        if not items or items[0].get("key") != "header":
            raise HubError(400, "Commit payload must start with a header line")
        operations = [(item.get("key"), item.get("value") or {}) for item in items[1:]]
        for _, value in operations:
            if value.get("content") and len(value["content"]) * 3 // 4 > self.hub.lfs_threshold:
                raise HubError(400, f"{value.get('path')} is too large for a regular file: use LFS")
        sha = self.hub.store.commit(rtype, repo_id, unquote(m["rev"]), operations, items[0]["value"], p.user)
        self._json({
            "success": True, "commitOid": sha, "hookOutput": "", "pullRequestUrl": None,
            "commitUrl": f"{self._base_url()}/{URL_PREFIX[rtype]}{repo_id}/commit/{sha}",
        })  # fmt: skip
