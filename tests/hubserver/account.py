"""Who is asking: the token's owner (a Principal), the read/write checks every endpoint makes, and
``GET /api/whoami-v2``.

Read-only tokens are plain configuration: ``role: "read"`` gets 403 on create/preupload/LFS/commit.
Tokens are never logged; the log holds the user name.
"""

from __future__ import annotations

import dataclasses
import hashlib

from .common import HubError, _now_iso


@dataclasses.dataclass
class Principal:
    user: str
    role: str = "write"  # "read" or "write"
    orgs: tuple = ()

    @property
    def namespaces(self) -> set:
        return {self.user, *self.orgs}

    def can_read(self, namespace: str) -> bool:
        return namespace in self.namespaces

    def can_write(self, namespace: str) -> bool:
        return self.role == "write" and namespace in self.namespaces


class AccountAPI:
    """Authentication and the account endpoints, mixed into the request handler."""

    def _principal(self) -> Principal | None:
        """The token's owner, None when anonymous; 401 for an unknown token (as the Hub does)."""
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        principal = self.hub._tokens.get(token)
        if principal is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        self._user = principal.user
        return principal

    def _require_principal(self) -> Principal:
        principal = self._principal()
        if principal is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return principal

    def _readable(self, rtype: str, repo_id: str) -> tuple[Principal | None, dict]:
        """The repo's metadata; 404 (not 403) for private repos of others, like the Hub."""
        principal = self._principal()
        meta = self.hub.store.meta(rtype, repo_id)
        namespace = repo_id.split("/")[0]
        if meta["private"] and not (principal and principal.can_read(namespace)):
            raise HubError(404, f"Repository Not Found: {repo_id}", "RepoNotFound")
        return principal, meta

    def _writable(self, rtype: str, repo_id: str) -> tuple[Principal, dict]:
        principal, meta = self._readable(rtype, repo_id)
        if principal is None or not principal.can_write(repo_id.split("/")[0]):
            raise HubError(403, f"You don't have the rights to write to {repo_id}: use a write token")
        return principal, meta

    # -- endpoints -------------------------------------------------------------------------------

    def h_whoami(self, m) -> None:
        p = self._require_principal()
        self._json({
            "type": "user", "id": hashlib.sha1(p.user.encode()).hexdigest()[:24], "name": p.user,
            "fullname": p.user, "email": f"{p.user}@example.invalid", "emailVerified": True,
            "canPay": False, "isPro": False, "periodEnd": None, "avatarUrl": "",
            "orgs": [{"type": "org", "name": o, "fullname": o, "roleInOrg": p.role} for o in p.orgs],
            "auth": {"type": "access_token",
                     "accessToken": {"displayName": "hubserver", "role": p.role, "createdAt": _now_iso()}},
        })  # fmt: skip

    # Telemetry's user agent fetches this registry on a process's first request: an empty one suffices.
    def h_agent_harnesses(self, m) -> None:
        self._json({"standardEnvVars": [], "harnesses": {}})
