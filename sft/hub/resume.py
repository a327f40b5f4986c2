"""Resume from the Hub on a fresh disk: the newest checkpoint whose manifest is up, downloaded and verified.

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
from .errors import HubError, redact, short_error
from ..units import size_text
from .manifest import FINAL, MANIFEST, hub_checkpoints, verify

DOWNLOAD_DIR = "hub-download"  # under OUTPUT/run/


class TornCheckpoint(Exception):
    """A checkpoint on the Hub without a manifest, or with a file missing or different from it."""


def final_on_hub(api, repo_id: str) -> bool:
    """The final model is on the Hub (its manifest is, which goes up after its files)."""
    return f"{FINAL}/{MANIFEST}" in set(api.list_repo_files(repo_id))


def _read_manifest(api, repo_id: str, prefix: str, work: Path) -> dict[str, Any]:
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = api.hf_hub_download(repo_id, f"{prefix}/{MANIFEST}", local_dir=work)
    except EntryNotFoundError:
        raise TornCheckpoint("no manifest (its upload was cut off)") from None
    try:
        manifest = json.loads(Path(path).read_text())
        if not isinstance(manifest.get("files"), dict) or not manifest["files"]:
            raise ValueError("no files listed")
    except (ValueError, AttributeError) as e:
        raise TornCheckpoint(f"unreadable manifest ({e})") from None
    return manifest


def download_checkpoint(api, repo_id: str, step: int, output_dir: Path) -> Path:
    """checkpoint-N from the Hub into OUTPUT/checkpoint-N, verified against its manifest; raises TornCheckpoint."""
    prefix, output_dir = f"checkpoint-{step}", Path(output_dir)
    work = output_dir / "run" / DOWNLOAD_DIR
    shutil.rmtree(work, ignore_errors=True)
    manifest = _read_manifest(api, repo_id, prefix, work)
    api.snapshot_download(repo_id, local_dir=work, allow_patterns=[f"{prefix}/{rel}" for rel in manifest["files"]])
    problems = verify(work / prefix, manifest)
    if problems:
        shutil.rmtree(work, ignore_errors=True)
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise TornCheckpoint("; ".join(problems[:3]) + more)
    dest = output_dir / prefix
    if dest.exists():  # an incomplete local copy: a complete one would have been resumed from instead
        say(f"warning: replacing the incomplete {dest} with the Hub's verified copy")
        shutil.rmtree(dest)
    os.replace(work / prefix, dest)  # one rename: checkpoint-N appears whole or not at all
    shutil.rmtree(work, ignore_errors=True)
    return dest


def resume_from_hub(api, repo_id: str, output_dir: Path,
                    log: Callable[[str], None] = say) -> Path | None:
    """The newest whole checkpoint on the Hub, downloaded into OUTPUT; torn ones are skipped with a warning."""
    try:
        complete, present = hub_checkpoints(api.list_repo_files(repo_id))
        for step in sorted(set(present) - set(complete), reverse=True):
            if not complete or step > complete[-1]:
                log(f"warning: checkpoint-{step} on the Hub has no manifest (its upload was cut off): skipped")
        for step in reversed(complete):
            try:
                path = download_checkpoint(api, repo_id, step, output_dir)
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
