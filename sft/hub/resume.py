"""Resume from the Hub on a fresh disk: the newest checkpoint whose manifest is up, downloaded and verified
(from checkpoints/checkpoint-N, or checkpoint-N at the root where an earlier version of the job put it).

A checkpoint on the Hub counts only with its manifest (the uploader commits it after the files). A
download is checked against it, file by file (size, then sha256), in OUTPUT/run/hub-download/, and
only a whole one is moved to OUTPUT/checkpoint-N: a torn checkpoint never appears in the output folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from .. import exitcodes
from ..console import say
from ..units import size_text
from .errors import HubError, redact, short_error
from .layout import MANIFEST, complete_prefix, final_done, hub_checkpoints, in_repo
from .manifest import verify

DOWNLOAD_DIR = "hub-download"  # under OUTPUT/run/


class TornCheckpoint(Exception):
    """A checkpoint on the Hub without a manifest, or with a file missing or different from it."""


def final_on_hub(api, repo_id: str, revision: str | None = None) -> bool:
    """The final model is on the Hub (its manifest is, which goes up after its files)."""
    return final_done(api.list_repo_files(repo_id, revision=revision))


def _read_manifest(api, repo_id: str, prefix: str, work: Path, revision: str | None) -> dict[str, Any]:
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = api.hf_hub_download(repo_id, in_repo(prefix, MANIFEST), local_dir=work, revision=revision)
    except EntryNotFoundError:
        raise TornCheckpoint("no manifest (its upload was cut off)") from None
    try:
        manifest = json.loads(Path(path).read_text())
        if not isinstance(manifest.get("files"), dict) or not manifest["files"]:
            raise ValueError("no files listed")
    except (ValueError, AttributeError) as e:
        raise TornCheckpoint(f"unreadable manifest ({e})") from None
    return manifest


def download_checkpoint(api, repo_id: str, step: int, output_dir: Path, revision: str | None = None,
                        prefix: str | None = None) -> Path:
    """checkpoint-N from the Hub (`prefix`: its folder there) into OUTPUT/checkpoint-N, verified against its
    manifest; raises TornCheckpoint."""
    name, output_dir = f"checkpoint-{step}", Path(output_dir)
    prefix = prefix or complete_prefix(api.list_repo_files(repo_id, revision=revision), step) or name
    work = output_dir / "run" / DOWNLOAD_DIR
    shutil.rmtree(work, ignore_errors=True)
    manifest = _read_manifest(api, repo_id, prefix, work, revision)
    api.snapshot_download(repo_id, local_dir=work, allow_patterns=[f"{prefix}/{rel}" for rel in manifest["files"]],
                          revision=revision)
    problems = verify(work / prefix, manifest)
    if problems:
        shutil.rmtree(work, ignore_errors=True)
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise TornCheckpoint("; ".join(problems[:3]) + more)
    dest = output_dir / name
    if dest.exists():  # an incomplete local copy: a complete one would have been resumed from instead
        say(f"warning: replacing the incomplete {dest} with the Hub's verified copy")
        shutil.rmtree(dest)
    os.replace(work / prefix, dest)  # one rename: checkpoint-N appears whole or not at all
    shutil.rmtree(work, ignore_errors=True)
    return dest


def resume_from_hub(api, repo_id: str, output_dir: Path, log: Callable[[str], None] = say,
                    revision: str | None = None) -> Path | None:
    """The newest whole checkpoint on the Hub, downloaded into OUTPUT; torn ones are skipped with a warning."""
    try:
        files = api.list_repo_files(repo_id, revision=revision)
        complete, present = hub_checkpoints(files)
        for step in sorted(set(present) - set(complete), reverse=True):
            if not complete or step > complete[-1]:
                log(f"warning: checkpoint-{step} on the Hub has no manifest (its upload was cut off): skipped")
        for step in reversed(complete):
            try:
                path = download_checkpoint(api, repo_id, step, output_dir, revision, complete_prefix(files, step))
            except TornCheckpoint as e:
                log(f"warning: checkpoint-{step} on the Hub is torn ({e}): skipped for the previous one")
                continue
            total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            log(f"resume: checkpoint-{step} downloaded from {repo_id} and verified ({size_text(total)})")
            return path
    except HubError:
        raise
    except Exception as e:  # noqa: BLE001 - a network failure must not become a silent start from scratch
        raise HubError(f"could not read checkpoints from the Hub repo {repo_id} ({redact(short_error(e), api.token)}): "
                       "start again later", exitcodes.HUB_UNREACHABLE) from None
    log(f"resume: no complete checkpoint on the Hub repo {repo_id}")
    return None
