"""Resume from the Hub on a fresh disk: the newest checkpoint whose manifest is up, downloaded and verified
(from checkpoints/checkpoint-N, or checkpoint-N at the root where an earlier version of the job put it).

A checkpoint on the Hub counts only with its manifest (the uploader commits it after the files): the
manifest says which files make it and what the uploader hashed. The Hub's own record of each file must
match the manifest before anything is downloaded; each file downloaded, into OUTPUT/run/hub-download/, is then
hashed against it while the others still download. Only a whole checkpoint is moved to OUTPUT/checkpoint-N: a torn
one never appears in the output folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .. import exitcodes
from ..console import say
from ..units import size_text
from .errors import HubError, redact, short_error
from .layout import MANIFEST, complete_prefix, final_done, hub_checkpoints, in_repo
from .manifest import hash_file

DOWNLOAD_DIR = "hub-download"  # under OUTPUT/run/
DOWNLOAD_WORKERS = 8  # files at once: snapshot_download's default max_workers


class TornCheckpoint(Exception):
    """A checkpoint on the Hub without a manifest, or with a file missing or different from it."""


def final_on_hub(api, repo_id: str, revision: str | None = None) -> bool:
    """The final model is on the Hub (its manifest is, which goes up after its files)."""
    return final_done(api.list_repo_files(repo_id, revision=revision))


def _read_manifest(api, repo_id: str, prefix: str, work: Path, revision: str) -> dict[str, Any]:
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


def against_hub(manifest: dict[str, Any], prefix: str, on_hub: dict[str, Any]) -> list[str]:
    """What the Hub's record (RepoFile by path) says differs from the manifest: checked before any download.

    The Hub records a sha256 for LFS files only (the one the uploader sent: the manifest's); the small
    files it keeps in git are checked against the manifest after the download.
    """
    problems = []
    for rel, entry in manifest["files"].items():
        hub_file = on_hub.get(f"{prefix}/{rel}")
        if hub_file is None:
            problems.append(f"{rel} is missing on the Hub")
        elif hub_file.size != entry["size"]:
            problems.append(f"{rel} has {hub_file.size} bytes on the Hub, the manifest says {entry['size']}")
        elif hub_file.lfs is not None and hub_file.lfs.sha256 != entry["sha256"]:
            problems.append(f"{rel}: the Hub's sha256 differs from the manifest")
    return problems


def download_and_check(api, repo_id: str, revision: str, work: Path, prefix: str, manifest: dict[str, Any],
                       on_hub: dict[str, Any]) -> list[str]:
    """Each file of the checkpoint downloaded into `work` and hashed against the manifest as soon as it is down, while
    the others still download; what differs ([] when whole).

    Why by hand: huggingface_hub downloads a folder with snapshot_download (hf_hub_download on DOWNLOAD_WORKERS threads)
    and checks it with verify_repo_checksums, which reads every byte again after the download, in one thread: a
    Qwen3-8B checkpoint of about 80 GB, hashed at 1-2 GB/s, added most of a minute to a resume's start. Here each
    file goes through the same hf_hub_download and is hashed while the next ones download. The Hub's record of every
    file equals the manifest (against_hub, before any download), so bytes that match the manifest match both.
    """
    def one(rel: str) -> str | None:
        entry = manifest["files"][rel]
        path = Path(api.hf_hub_download(repo_id, f"{prefix}/{rel}", revision=revision, local_dir=work))
        digest, size = hash_file(path)
        if size != entry["size"]:
            return f"{rel} has {size} bytes after the download, the manifest says {entry['size']}"
        if digest == entry["sha256"]:
            return None
        if on_hub[f"{prefix}/{rel}"].lfs is not None:  # its sha256 on the Hub is the manifest's
            return f"{rel}: its sha256 differs from the Hub's record"
        return f"{rel}: sha256 differs from the manifest"  # a small file kept in git: the Hub records no sha256

    largest_first = sorted(manifest["files"], key=lambda rel: -manifest["files"][rel]["size"])  # the longest starts first
    with ThreadPoolExecutor(DOWNLOAD_WORKERS) as pool:
        return [problem for problem in pool.map(one, largest_first) if problem]


def download_checkpoint(api, repo_id: str, step: int, output_dir: Path, revision: str | None = None,
                        prefix: str | None = None) -> Path:
    """checkpoint-N from the Hub (`prefix`: its folder there) into OUTPUT/checkpoint-N, verified against its
    manifest and the Hub's own record; raises TornCheckpoint."""
    from huggingface_hub.hf_api import RepoFile

    name, output_dir = f"checkpoint-{step}", Path(output_dir)
    commit = api.repo_info(repo_id, revision=revision).sha  # one commit for the manifest, the files and their check
    prefix = prefix or complete_prefix(api.list_repo_files(repo_id, revision=commit), step) or name
    work = output_dir / "run" / DOWNLOAD_DIR
    shutil.rmtree(work, ignore_errors=True)
    manifest = _read_manifest(api, repo_id, prefix, work, commit)
    paths = [f"{prefix}/{rel}" for rel in manifest["files"]]
    on_hub = {f.path: f for f in api.get_paths_info(repo_id, paths, revision=commit) if isinstance(f, RepoFile)}
    problems = against_hub(manifest, prefix, on_hub)
    if not problems:
        problems = download_and_check(api, repo_id, commit, work, prefix, manifest, on_hub)
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
            began = time.monotonic()
            try:
                path = download_checkpoint(api, repo_id, step, output_dir, revision, complete_prefix(files, step))
            except TornCheckpoint as e:
                log(f"warning: checkpoint-{step} on the Hub is torn ({e}): skipped for the previous one")
                continue
            seconds = time.monotonic() - began  # what a resume from the Hub costs before the ranks start
            total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            log(f"resume: checkpoint-{step} downloaded from {repo_id} and verified ({size_text(total)} in "
                f"{seconds:.1f} s, {total / 1e6 / max(seconds, 1e-3):.1f} MB/s)")
            return path
    except HubError:
        raise
    except Exception as e:  # noqa: BLE001 - a network failure must not become a silent start from scratch
        raise HubError(f"could not read checkpoints from the Hub repo {repo_id} ({redact(short_error(e), api.token)}): "
                       "start again later", exitcodes.HUB_UNREACHABLE) from None
    log(f"resume: no complete checkpoint on the Hub repo {repo_id}")
    return None
