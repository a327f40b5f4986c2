"""Tree listings: ``GET .../tree/{rev}[/{path}]`` and ``POST .../paths-info/{rev}``, and the items they
list (folders first, like the Hub; ``expand=true`` adds each item's last commit)."""

from __future__ import annotations

import hashlib
import json
from urllib.parse import parse_qs, unquote

from .common import HubError, _truthy
from .store import RepoStore


def _file_item(path: str, entry: dict) -> dict:
    item = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
    if entry["lfs"]:
        item["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": entry["pointerSize"]}
    return item


def _dir_signature(files: dict, path: str):
    """What identifies the content of a file or folder (None if absent), to find last commits."""
    if path in files:
        return files[path]["oid"]
    under = sorted((p, e["oid"]) for p, e in files.items() if p.startswith(path + "/"))
    return hashlib.sha1(json.dumps(under).encode()).hexdigest() if under else None


def _dir_item(path: str, files: dict) -> dict:
    return {"type": "directory", "oid": _dir_signature(files, path), "size": 0, "path": path}


def tree_items(files: dict, path: str, recursive: bool) -> list[dict]:
    """The items under `path` (folders first, like the Hub); 404 if `path` is not a folder."""
    prefix = f"{path}/" if path else ""
    if path and not any(p.startswith(prefix) for p in files):
        raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
    dirs, leafs = set(), []
    for p in sorted(files):
        if not p.startswith(prefix):
            continue
        parts = p[len(prefix) :].split("/")
        if recursive:
            dirs.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts)))
            leafs.append(p)
        elif len(parts) == 1:
            leafs.append(p)
        else:
            dirs.add(prefix + parts[0])
    return [_dir_item(d, files) for d in sorted(dirs)] + [_file_item(p, files[p]) for p in leafs]


def add_last_commits(store: RepoStore, rtype: str, repo_id: str, sha: str, items: list[dict]) -> None:
    """`expand=true`: attach the last commit that changed each item (walks the history)."""
    pending = {item["path"]: item for item in items}
    for commit in store.history(rtype, repo_id, sha):
        if not pending:
            break
        parent = commit["parents"][0] if commit["parents"] else None
        parent_files = store.commit_data(rtype, repo_id, parent)["files"] if parent else {}
        for path in list(pending):
            if _dir_signature(commit["files"], path) != _dir_signature(parent_files, path):
                info = {"id": commit["id"], "title": commit["title"], "date": commit["date"]}
                pending.pop(path)["lastCommit"] = info


class TreeAPI:
    """The listing endpoints, mixed into the request handler."""

    def h_tree(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        path = unquote(m["path"] or "").strip("/")
        items = tree_items(files, path, _truthy(self.query.get("recursive", ["false"])[0]))
        if _truthy(self.query.get("expand", ["false"])[0]):
            add_last_commits(self.hub.store, rtype, repo_id, sha, items)
        self._paginated(items)

    def h_paths_info(self, m) -> None:
        rtype, repo_id = m["rtype"], m["repo_id"]
        form = parse_qs(self._read_body().decode())
        self._readable(rtype, repo_id)
        sha, files = self.hub.store.files(rtype, repo_id, unquote(m["rev"]))
        items = []
        for path in (p.strip("/") for p in form.get("paths", [])):
            if path in files:
                items.append(_file_item(path, files[path]))
            elif any(p.startswith(path + "/") for p in files):
                items.append(_dir_item(path, files))
        if _truthy(form.get("expand", ["false"])[0]):
            add_last_commits(self.hub.store, rtype, repo_id, sha, items)
        self._json(items)
