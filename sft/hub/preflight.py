"""The Hub's check at the start of a job, before any GPU work: the token is there and accepted, it can
write to the repo, and the repo is private (created private if missing; a public one is refused); with a
branch (SFT_HUB_REVISION), the branch exists (made from main if missing).

The token is found as huggingface_hub finds it (get_token: HF_TOKEN, else the file at HF_TOKEN_PATH, else
the login `hf auth login` saved); it lives in the HfApi object only."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import exitcodes
from ..console import say
from .errors import HubError, http_status, redact, retry_after, short_error, transient

PREFLIGHT_TRIES = 3  # whoami, repo_info and create_repo are not retried by huggingface_hub itself


@dataclass(frozen=True)
class HubTarget:
    """A repo that preflight found private and writable, and the client that writes to it."""

    repo_id: str
    endpoint: str
    user: str
    created: bool
    api: Any = field(repr=False, compare=False)  # HfApi: it holds the token, so it is never serialised
    revision: str | None = None  # the branch uploads go to; None: main

    @property
    def url(self) -> str:
        return f"{self.endpoint}/{self.repo_id}" + (f"/tree/{self.revision}" if self.revision else "")

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "url": self.url, "user": self.user, "created": self.created,
                "revision": self.revision}


def preflight(repo_id: str, token: str | None, endpoint: str | None = None, revision: str | None = None) -> HubTarget:
    """Before any GPU work: the token exists, whoami answers, it can write, the repo is private (made if missing),
    and the branch `revision` exists (made from main if missing)."""
    from huggingface_hub import HfApi, constants

    if not token:
        raise HubError(f"SFT_HUB_REPO={repo_id!r} needs HF_TOKEN: a Hugging Face token with write access "
                       "(https://huggingface.co/settings/tokens), in HF_TOKEN or saved by `hf auth login` (or in "
                       "the file HF_TOKEN_PATH names)", exitcodes.HUB_AUTH)
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"SFT_HUB_REPO={repo_id!r} but HF_HUB_OFFLINE=1 forbids the Hub: unset one of them",
                       exitcodes.BAD_SETTINGS)
    api = HfApi(endpoint=endpoint, token=token)
    me = _preflight_call(api, "whoami", api.whoami)
    check_write_access(me, repo_id)
    created = _ensure_private(api, repo_id)
    if revision:
        _preflight_call(api, f"create_branch({revision})", api.create_branch, repo_id, branch=revision, exist_ok=True)
        say(f"hub: uploading to branch {revision} of {repo_id}")
    return HubTarget(repo_id, api.endpoint, me.get("name", "?"), created, api, revision)


def _preflight_call(api, what: str, fn: Callable, *args, **kwargs):
    """One call of the preflight: retried when transient, a HubError when the token is refused or the Hub is out."""
    for attempt in range(1, PREFLIGHT_TRIES + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - sorted below into refused, transient, or the caller's
            status = http_status(e)
            if status == 401:
                raise HubError(f"HF_TOKEN was refused by the Hub at {api.endpoint} (401 on {what}: invalid, "
                               "expired or revoked): make a new token with write access", exitcodes.HUB_AUTH) from None
            if not transient(e):
                raise _refused(api, what, e)
            if attempt == PREFLIGHT_TRIES:
                raise HubError(f"the Hub at {api.endpoint} did not answer {what} after {attempt} tries "
                               f"({redact(short_error(e), api.token)}): start again later",
                               exitcodes.HUB_UNREACHABLE) from None
            time.sleep(retry_after(e) or attempt)


def _refused(api, what: str, e: Exception) -> Exception:
    """A call that no later try can change: a name the Hub (or huggingface_hub's own check of the arguments, an
    HFValidationError) refuses is a setting to fix, exit 2, never "start again later"; anything else goes to the
    caller as it came (a repo not found is the caller's to handle)."""
    from huggingface_hub.errors import HFValidationError

    status = http_status(e)
    if isinstance(e, HFValidationError) or status in (400, 422):
        why = redact(short_error(e), api.token)
        return HubError(f"the Hub at {api.endpoint} refused {what} ({why}): SFT_HUB_REPO and SFT_HUB_REVISION must "
                        "be names it takes (owner/name; letters, digits, - _ .)", exitcodes.BAD_SETTINGS)
    if status == 403:
        return HubError(f"HF_TOKEN may not {what} at {api.endpoint} (403): it needs write access there",
                        exitcodes.HUB_AUTH)
    return e


def check_write_access(me: dict, repo_id: str) -> None:
    """Refuse a token that whoami says cannot write to the repo: read role, fine-grained without repo.write."""
    namespace, user = repo_id.split("/")[0], me.get("name", "?")
    orgs = {o.get("name"): o for o in me.get("orgs") or []}
    if namespace != user and namespace not in orgs:
        raise HubError(f"HF_TOKEN belongs to {user!r}, who cannot write under {namespace!r}: SFT_HUB_REPO must be "
                       f"under one of {', '.join([user, *orgs])}", exitcodes.HUB_AUTH)
    access = (me.get("auth") or {}).get("accessToken") or {}
    role, name = access.get("role"), access.get("displayName", "?")
    if role == "read":
        raise HubError(f"HF_TOKEN ({name!r}) is a read-only token: SFT_HUB_REPO needs one with write access",
                       exitcodes.HUB_AUTH)
    if role == "fineGrained" and not _fine_grained_writes(access.get("fineGrained") or {}, namespace, repo_id):
        raise HubError(f"HF_TOKEN ({name!r}) is fine-grained without write access to {repo_id} "
                       "(repo.write on the repo or its owner)", exitcodes.HUB_AUTH)
    if namespace in orgs and orgs[namespace].get("roleInOrg") == "read":
        raise HubError(f"{user!r} has the read role in {namespace!r}: it cannot write {repo_id}", exitcodes.HUB_AUTH)
    # Any other role (write, admin, or none reported) is trusted here; a refusal shows on the first write.


def _fine_grained_writes(grants: dict, namespace: str, repo_id: str) -> bool:
    for scope in grants.get("scoped") or []:
        entity = scope.get("entity") or {}
        if entity.get("name") in (namespace, repo_id) and "repo.write" in (scope.get("permissions") or []):
            return True
    return False


def _ensure_private(api, repo_id: str) -> bool:
    """The repo exists and is private afterwards; True if it was created. A public repo is refused."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    created = False
    try:
        info = _preflight_call(api, f"repo_info({repo_id})", api.repo_info, repo_id)
    except RepositoryNotFoundError:
        try:
            _preflight_call(api, f"create_repo({repo_id})", api.create_repo, repo_id, private=True)
        except HfHubHTTPError as e:
            raise _create_refused(repo_id, e) from None
        info = _preflight_call(api, f"repo_info({repo_id})", api.repo_info, repo_id)
        created = True
    if info.private is not True:
        raise HubError(f"{repo_id} on {api.endpoint} is public, and this job never uploads to a public repo (a "
                       "checkpoint is the whole training state): make it private on its settings page, or set "
                       "SFT_HUB_REPO to a new name, which the job creates private", exitcodes.HUB_PUBLIC_REPO)
    say(f"hub: {'created private repo' if created else 'private repo'} {api.endpoint}/{repo_id}")
    return created


def _create_refused(repo_id: str, e: Exception) -> HubError:
    status = http_status(e)
    if status == 409:
        return HubError(f"{repo_id} exists but HF_TOKEN cannot see it (someone else's private repo?): "
                        "pick another SFT_HUB_REPO", exitcodes.HUB_AUTH)
    if status == 403:
        return HubError(f"HF_TOKEN may not create {repo_id} (403): it needs write access to that namespace",
                        exitcodes.HUB_AUTH)
    if status in (400, 422):  # the name: no later start can change it
        return HubError(f"the Hub refused to create {repo_id} ({short_error(e)}): pick an SFT_HUB_REPO it takes "
                        "(owner/name; letters, digits, - _ .)", exitcodes.BAD_SETTINGS)
    return HubError(f"could not create {repo_id} ({short_error(e)})",
                    exitcodes.HUB_UNREACHABLE if transient(e) else exitcodes.BAD_SETTINGS)
