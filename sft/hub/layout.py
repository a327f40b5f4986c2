"""Where each thing goes in the Hub repo, so the model is where people look for it:

    config.json, model.safetensors, tokenizer files, ...   the final model, at the root: from_pretrained("user/repo")
    manifest.json                                          the final model's manifest (goes up after its files)
    README.md                                              the model card
    checkpoints/checkpoint-N/..., .../manifest.json        the newest DeepSpeed checkpoints
    run/summary.json, run/loss.png, run/events.jsonl, ...  the run's reports

A repo written by an earlier version of the job (checkpoint-N/ and final/ at the root) is still read: its
checkpoints resume and its final model counts as done; new uploads go to the places above.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MANIFEST = "manifest.json"  # in each folder the job uploads: its files, sizes and sha256s; committed last
CHECKPOINTS = "checkpoints"
ROOT = ""  # the final model's prefix
OLD_FINAL = "final"  # where an earlier version of the job put it
FINAL_NAME = "final"  # the final model's name in logs, commit titles and upload records
KEEP_AT_ROOT = frozenset({"README.md", ".gitattributes"})  # root files that are not the final model's
STEP_DIR = re.compile(rf"^(?P<prefix>(?:{CHECKPOINTS}/)?checkpoint-(?P<step>\d+))/")


def in_repo(prefix: str, rel: str) -> str:
    """A file's path in the repo under `prefix` ('' is the root)."""
    return f"{prefix}/{rel}" if prefix else rel


def checkpoint_prefix(name: str) -> str:
    """'checkpoint-8' -> 'checkpoints/checkpoint-8'."""
    return f"{CHECKPOINTS}/{name}"


def step_prefixes(paths: Iterable[str]) -> dict[int, set[str]]:
    """Each step with a file in the repo, and the folders holding it (both layouts, should a repo have both)."""
    found: dict[int, set[str]] = {}
    for path in paths:
        if m := STEP_DIR.match(path):
            found.setdefault(int(m.group("step")), set()).add(m.group("prefix"))
    return found


def hub_checkpoints(paths: Iterable[str]) -> tuple[list[int], list[int]]:
    """From a repo's file list: (steps whose manifest is up, steps with any file), oldest first."""
    paths = set(paths)
    prefixes = step_prefixes(paths)
    complete = {step for step, where in prefixes.items() if any(f"{p}/{MANIFEST}" in paths for p in where)}
    return sorted(complete), sorted(prefixes)


def complete_prefix(paths: Iterable[str], step: int) -> str | None:
    """The folder of checkpoint-`step` that has a manifest (the new layout's first), or None."""
    paths = set(paths)
    for prefix in (checkpoint_prefix(f"checkpoint-{step}"), f"checkpoint-{step}"):
        if f"{prefix}/{MANIFEST}" in paths:
            return prefix
    return None


def final_done(paths: Iterable[str]) -> bool:
    """The final model is in the repo: its manifest at the root, or in final/ (an earlier version's layout)."""
    paths = set(paths)
    return MANIFEST in paths or f"{OLD_FINAL}/{MANIFEST}" in paths
