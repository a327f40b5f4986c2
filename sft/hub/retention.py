"""Retention on the Hub: the newest `keep` checkpoints with a manifest stay, older ones go, and so do the
LFS objects that only they used (a deleted file stays in the repo's history, and is billed)."""

from __future__ import annotations

from typing import Callable

from ..units import size_text
from .errors import http_status, redact, short_error
from .layout import STEP_DIR, hub_checkpoints, step_prefixes


class Retention:
    """Deletes Hub checkpoints beyond the newest `keep` with a manifest, and frees their storage."""

    def __init__(self, api, repo_id: str, keep: int, log: Callable[[str], None], revision: str | None = None):
        self.api, self.repo, self.keep, self._log, self.revision = api, repo_id, int(keep), log, revision
        self._purge_unsupported = False  # the endpoint answered 404: a Hub without it (the local test one)

    def apply(self, hub_files: set[str]) -> list[int]:
        """Delete the checkpoints beyond the newest `keep` with a manifest (torn older ones too); returns their steps.

        Nothing newer than the newest manifest is deleted: that may be an upload in progress.
        """
        from huggingface_hub import CommitOperationDelete

        complete, present = hub_checkpoints(hub_files)
        if not complete:
            return []
        kept = complete[-self.keep:]
        doomed = [s for s in present if s not in kept and s < complete[-1]]
        if not doomed:
            return []
        where = step_prefixes(hub_files)
        ops = [CommitOperationDelete(f"{prefix}/", is_folder=True) for s in doomed for prefix in sorted(where[s])]
        names = ", ".join(f"checkpoint-{s}" for s in doomed)
        self.api.create_commit(self.repo, ops, commit_message=f"retention: delete {names}", revision=self.revision)
        self._log(f"deleted {names} from the Hub (it keeps {', '.join(f'checkpoint-{s}' for s in kept)})")
        self.free_storage()
        return doomed

    def free_storage(self) -> None:
        """Purge the LFS objects that only deleted checkpoints used: a deleted file stays in history, and billed."""
        if self._purge_unsupported:
            return
        try:
            # An object any branch still holds stays: runs on other branches (SFT_HUB_REVISION) share the repo.
            branches = [b.name for b in self.api.list_repo_refs(self.repo).branches]
            head = {item.lfs.sha256 for branch in branches
                    for item in self.api.list_repo_tree(self.repo, recursive=True, revision=branch)
                    if getattr(item, "lfs", None) is not None}
            orphans = [f for f in self.api.list_lfs_files(self.repo)
                       if STEP_DIR.match(f.filename or "") and f.file_oid not in head]
            if orphans:
                self.api.permanently_delete_lfs_files(self.repo, orphans)
                self._log(f"freed {size_text(sum(f.size for f in orphans))} of deleted checkpoints' files")
        except Exception as e:  # noqa: BLE001 - storage is freed at a later deletion; uploads go on
            self._purge_unsupported = http_status(e) in (404, 405, 501)
            why = redact(short_error(e), self.api.token)
            self._log(f"warning: could not free the storage of deleted checkpoints ({why}): their files stay in "
                      "the repo's history and count against its storage")
