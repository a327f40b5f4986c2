"""The test control plane, routes under /_test/ (never faulted, never in the request log):
  GET    /_test/health
  GET    /_test/log            {"requests": [{"method", "path", "status", "fault", "user", ...}]}
  DELETE /_test/log
  GET    /_test/faults         {"faults": [{..., "hits": n}]}
  POST   /_test/faults         one fault object, or {"faults": [...]}  -> {"ids": [...]}
  DELETE /_test/faults
  POST   /_test/tokens         {"token", "user", "role", "orgs"}  (add a token at runtime)
  POST   /_test/reset          clear faults and log
They let a test steer a server in another process as it steers an in-process HubServer.
"""

from __future__ import annotations

from .common import HubError


class ControlAPI:
    """The /_test/ routes, mixed into the request handler."""

    def _test_api(self) -> None:
        hub, route, method = self.hub, self.route_path, self.command
        if route == "/_test/health":
            return self._json({"ok": True})
        if route == "/_test/log" and method in ("GET", "DELETE"):
            if method == "DELETE":
                hub.clear_log()
            return self._json({"requests": hub.request_log()})
        if route == "/_test/faults" and method == "GET":
            return self._json({"faults": hub.faults.snapshot()})
        if route == "/_test/faults" and method == "DELETE":
            hub.faults.clear()
            return self._json({"faults": []})
        if route == "/_test/faults" and method == "POST":
            body = self._json_body()
            try:
                ids = [hub.add_fault(**spec) for spec in body.get("faults", [body])]
            except (TypeError, ValueError) as err:
                raise HubError(400, f"Bad fault: {err}") from None
            return self._json({"ids": ids})
        if route == "/_test/tokens" and method == "POST":
            body = self._json_body()
            hub.add_token(body["token"], body["user"], body.get("role", "write"), body.get("orgs", ()))
            return self._json({"user": body["user"], "role": body.get("role", "write")})
        if route == "/_test/reset" and method == "POST":
            hub.reset()
            return self._json({"ok": True})
        raise HubError(404, f"Unknown test route: {method} {route}")
