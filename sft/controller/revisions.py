"""The commit a Hub model or dataset is at: SFT_MODEL_REVISION / SFT_DATASET_REVISION (a branch, tag or
commit; unset: main) resolved once at start, so every rank and node loads the same files and the summary
and the model card say which, for a run to be repeated exactly. Local paths have none."""

from __future__ import annotations

import re
from pathlib import Path

COMMIT = re.compile(r"^[0-9a-f]{40}$")


class RevisionError(Exception):
    """The repo or the revision cannot be found: one line saying which and why."""


def resolve(repo_id: str, repo_type: str, revision: str | None) -> str | None:
    """The commit of `revision` (None: main); offline, the one the cache holds (None: the cache has none)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if constants.HF_HUB_OFFLINE:
        return cached(repo_id, repo_type, revision)
    try:
        return HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision).sha
    except RevisionNotFoundError:
        raise RevisionError(f"{repo_id} has no branch, tag or commit {revision!r}") from None
    except RepositoryNotFoundError:  # also a gated or private repo without a token that can read it
        raise RevisionError(f"{repo_id}: no such {repo_type} on the Hub, or no access (HF_TOKEN)") from None
    except Exception as e:  # the Hub did not answer: what the cache holds is still exact, if it holds it
        if (commit := cached(repo_id, repo_type, revision)) is not None:
            return commit
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RevisionError(f"{repo_id}: the Hub did not answer ({why}) and the cache holds no commit of it") from None


def cached(repo_id: str, repo_type: str, revision: str | None) -> str | None:
    """The commit the local Hub cache recorded for `revision` (huggingface_hub's refs/ files), if any."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    if revision is not None and COMMIT.match(revision):
        return revision
    ref = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=repo_type) / "refs" / (
        revision or "main")
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if COMMIT.match(commit) else None
