"""Routing: which endpoint answers a request, and the life of a request from its arrival to its
log entry. The endpoints themselves live in the modules named after their group.

  GET    /api/whoami-v2                                  user + auth.accessToken.role
  POST   /api/repos/create                               409 if the repo exists, 403 for read tokens
  DELETE /api/repos/delete
  GET    /api/{models|datasets}/{ns}/{name}[/revision/{rev}]   repo info (private, sha, siblings;
                                                         ?blobs=true adds size/blobId/lfs)
  PUT    /api/{type}/{ns}/{name}/settings                {"visibility": "private"|"public"} or {"private": bool}
  POST   /api/{type}/{ns}/{name}/preupload/{rev}         decides "regular" vs "lfs" per file
  POST   /api/{type}/{ns}/{name}/commit/{rev}            NDJSON: header, file, lfsFile, deletedFile, deletedFolder
  GET    /api/{type}/{ns}/{name}/tree/{rev}[/{path}]     ?recursive=&expand=, paginated with a Link header
  POST   /api/{type}/{ns}/{name}/paths-info/{rev}        form: paths=...&expand=
  GET    /api/{type}/{ns}/{name}/refs                    branches
  POST   /api/{type}/{ns}/{name}/branch/{branch}         {"startingPoint"?}: a branch from main (or that rev); 409
  DELETE /api/{type}/{ns}/{name}/branch/{branch}
  GET    /api/{type}/{ns}/{name}/commits/{rev}           list_repo_commits
  GET    /api/{type}/{ns}/{name}/xet-{read,write}-token/ always 501: this server has no Xet storage
  GET    /api/agent-harnesses                            empty registry (see the package docstring)
  POST   /api/validate-yaml                              {"content", "repoType"}: checks a README.md's YAML
                                                         front matter (see cards.py)
  POST   /[datasets/]{ns}/{name}.git/info/lfs/objects/batch   LFS batch API, "basic" transfer only
  PUT    /_lfs/upload/{ticket}                           the upload href handed out by the batch API
  POST   /_lfs/verify/{ticket}                           the verify href
  GET|HEAD /[datasets/]{ns}/{name}/resolve/{rev}/{path}  ETag, X-Repo-Commit, X-Linked-Etag/-Size (LFS),
                                                         Content-Length, Accept-Ranges, Range -> 206
"""

from __future__ import annotations

import re
import traceback
from urllib.parse import parse_qs, urlsplit

from .account import AccountAPI
from .cards import CardAPI
from .commits import CommitAPI
from .common import HubError
from .control import ControlAPI
from .faults import FaultActions
from .files import FileAPI
from .lfs import LfsAPI
from .repos import RepoAPI
from .transport import Transport
from .trees import TreeAPI

REPO = r"/api/(?P<rtype>models|datasets)/(?P<repo_id>[^/]+/[^/]+)"
GIT_REPO = r"/(?:(?P<prefix>datasets)/)?(?P<repo_id>[^/]+/[^/]+?)"
ROUTES = [
    ("GET", r"/api/whoami-v2", "whoami"),
    ("GET", r"/api/agent-harnesses", "agent_harnesses"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("POST", r"/api/repos/create", "create_repo"),
    ("DELETE", r"/api/repos/delete", "delete_repo"),
    ("GET", REPO + r"(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
    ("PUT", REPO + r"/settings", "settings"),
    ("POST", REPO + r"/preupload/(?P<rev>[^/]+)", "preupload"),
    ("POST", REPO + r"/commit/(?P<rev>[^/]+)", "commit"),
    ("GET", REPO + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree"),
    ("POST", REPO + r"/paths-info/(?P<rev>[^/]+)", "paths_info"),
    ("GET", REPO + r"/refs", "refs"),
    ("POST", REPO + r"/branch/(?P<branch>[^/]+)", "create_branch"),
    ("DELETE", REPO + r"/branch/(?P<branch>[^/]+)", "delete_branch"),
    ("GET", REPO + r"/commits/(?P<rev>[^/]+)", "commits"),
    ("GET", REPO + r"/xet-(?:read|write)-token/.*", "xet_token"),
    ("POST", GIT_REPO + r"\.git/info/lfs/objects/batch", "lfs_batch"),
    ("PUT", r"/_lfs/upload/(?P<ticket>[0-9a-f]+)", "lfs_put"),
    ("POST", r"/_lfs/verify/(?P<ticket>[0-9a-f]+)", "lfs_verify"),
    ("GET", GIT_REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    ("HEAD", GIT_REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
]
ROUTES = [(method, re.compile(pattern + "$"), name) for method, pattern, name in ROUTES]


class _Handler(AccountAPI, CardAPI, RepoAPI, CommitAPI, LfsAPI, TreeAPI, FileAPI, ControlAPI, FaultActions,
               Transport):  # fmt: skip
    """One request per do_* call; each endpoint group is a mixin, so its module reads on its own."""

    def do_GET(self):
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def _handle(self) -> None:
        url = urlsplit(self.path)
        self.route_path, self.query = url.path, parse_qs(url.query)
        self._status = self._fault = self._truncate_at = self._user = None
        self._body, self._body_done = None, False
        self._entry = None
        if self.route_path.startswith("/_test/"):
            return self._guarded(self._test_api)  # control plane: never faulted nor logged
        self._entry = self.hub._open_entry(self)
        try:
            self._guarded(self._serve)
        finally:
            self._log_outcome()

    def _guarded(self, fn) -> None:
        try:
            fn()
        except HubError as err:
            self._send_error(err)
        except (ConnectionError, TimeoutError):  # socket.timeout is TimeoutError
            self.close_connection = True  # the client went away; nothing to answer
        except Exception as err:  # a bug in this server: answer 500 and say where
            traceback.print_exc()
            self._send_error(HubError(500, f"hubserver internal error: {err!r}"))

    def _serve(self) -> None:
        fault = self.hub.faults.take(self.command, self.route_path)
        if fault is not None:
            self._fault = fault
            self._entry.update(fault=fault.kind, fault_id=fault.id)
            if self._apply_fault(fault):
                return
        self._dispatch()

    def _dispatch(self) -> None:
        for method, pattern, name in ROUTES:
            if method == self.command and (match := pattern.match(self.route_path)):
                return getattr(self, "h_" + name)(match.groupdict())
        raise HubError(404, f"Not Found: {self.command} {self.route_path}")
