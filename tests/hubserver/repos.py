"""Repos: create, delete, info, settings, branches (list, create, delete) and commit history; and the Xet token routes,
which always answer 501 because this server has no Xet storage."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote

from .common import REPO_TYPES, URL_PREFIX, HubError, _truthy


class RepoAPI:
    """The repo endpoints, mixed into the request handler."""

    def h_create_repo(self, m) -> None:
        body = self._json_body()
        p = self._require_principal()
        rtype = REPO_TYPES.get(body.get("type") or "model")
        if rtype is None:
            raise HubError(400, f"Unsupported repo type: {body.get('type')}")
        namespace, name = body.get("organization") or p.user, body.get("name") or ""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", name):
            raise HubError(400, f"Invalid repo name: {name!r}")
        repo_id = f"{namespace}/{name}"
        if not p.can_write(namespace):
            raise HubError(403, f'You don\'t have the rights to create a repo under the namespace "{namespace}"')
        url = f"{self._base_url()}/{URL_PREFIX[rtype]}{repo_id}"
        with self.hub.store.lock:
            if self.hub.store.exists(rtype, repo_id):
                raise HubError(409, "You already created this repo", extra={"url": url})
            private = body.get("visibility") == "private" or body.get("private") is True
            self.hub.store.create(rtype, repo_id, private, p.user)
        self._json({"url": url, "name": repo_id, "id": repo_id})

    def h_delete_repo(self, m) -> None:
        body = self._json_body()
        p = self._require_principal()
        rtype = REPO_TYPES.get(body.get("type") or "model", "models")
        repo_id = f"{body.get('organization') or p.user}/{body.get('name')}"
        self._writable(rtype, repo_id)
        self.hub.store.delete(rtype, repo_id)
        self._json({})

    def h_repo_info(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        _, meta = self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"] or "main"))
        commit = self.hub.store.commit_data(rtype, repo_id, sha)
        blobs = _truthy(self.query.get("blobs", ["false"])[0])
        siblings = []
        for path in sorted(files):
            sibling = {"rfilename": path}
            if blobs:
                entry = files[path]
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if entry["lfs"]:
                    sibling["lfs"] = {"size": entry["size"], "sha256": entry["sha256"],
                                      "pointerSize": entry["pointerSize"]}  # fmt: skip
            siblings.append(sibling)
        self._json({
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": repo_id.split("/")[0], "sha": sha, "lastModified": commit["date"],
            "createdAt": meta["createdAt"], "private": meta["private"], "gated": meta.get("gated", False),
            "disabled": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "usedStorage": sum(e["size"] for e in files.values()),
        })  # fmt: skip

    def h_settings(self, m) -> None:
        body = self._json_body()
        self._writable(m["rtype"], m["repo_id"])
        changes = {}
        if "visibility" in body:
            if body["visibility"] not in ("public", "private"):
                raise HubError(400, f"Unsupported visibility: {body['visibility']!r}")
            changes["private"] = body["visibility"] == "private"
        if "private" in body:
            changes["private"] = bool(body["private"])
        if "gated" in body:
            changes["gated"] = body["gated"]
        meta = self.hub.store.update_meta(m["rtype"], m["repo_id"], **changes)
        self._json({"private": meta["private"], "gated": meta.get("gated", False)})

    def h_refs(self, m) -> None:
        _, meta = self._readable(m["rtype"], m["repo_id"])
        branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha} for b, sha in meta["refs"].items()]
        self._json({"branches": branches, "converts": [], "tags": [], "pullRequests": []})

    def h_create_branch(self, m) -> None:
        body = self._json_body()
        self._writable(m["rtype"], m["repo_id"])
        self.hub.store.create_branch(m["rtype"], m["repo_id"], unquote(m["branch"]), body.get("startingPoint"))
        self._json({})

    def h_delete_branch(self, m) -> None:
        self._writable(m["rtype"], m["repo_id"])
        self.hub.store.delete_branch(m["rtype"], m["repo_id"], unquote(m["branch"]))
        self._json({})

    def h_commits(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        self._readable(rtype, repo_id)
        sha = self.hub.store.resolve(rtype, repo_id, unquote(m["rev"]))
        items = [
            {"id": c["id"], "title": c["title"], "message": c["message"],
             "authors": [{"user": c["author"]}], "date": c["date"]}
            for c in self.hub.store.history(rtype, repo_id, sha)
        ]  # fmt: skip
        self._paginated(items)

    def h_xet_token(self, m) -> None:
        raise HubError(
            501, "This local hub has no Xet storage: set HF_HUB_DISABLE_XET=1 so the client uses LFS.",
        )
