"""A start on an output folder that already holds a finished run: the same run (nothing to do), or another
one the user meant to start (say what differs and how to start it). Pure: the settings as dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..settings import env_name

# How a run is started, watched, paced and uploaded, not what it trains: these may differ between the
# starts of one run. Every other setting (those added later too) counts as a different run. config: where the
# settings were written (a job file or the environment); what they say is compared, setting by setting.
HOW_IT_RUNS = frozenset({
    "probe_steps", "batch_search", "gpus", "cpu_ranks", "launcher", "price_per_hour", "hub_repo", "upload_minutes",
    "save_minutes", "save_steps", "save_background", "stop_grace_seconds", "node_timeout_seconds", "output_dir",
    "config",
})


def differences(finished: Mapping[str, Any], now: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """The settings of this start that differ from the finished run's, as 'name: now (finished: before)'.

    A setting the finished run's record lacks (it came with a newer job) is compared with its default."""
    changed = []
    for name in sorted(now):
        if name in HOW_IT_RUNS:
            continue
        before = finished.get(name, defaults.get(name))
        if before != now[name]:
            changed.append(f"{env_name(name)}={now[name]!r} (the finished run: {before!r})")
    return changed


def verdict(finished: Mapping[str, Any], now: Mapping[str, Any], defaults: Mapping[str, Any],
            where: str) -> tuple[bool, str]:
    """(the same run, what to say): the same run has nothing left to do; another one is not started here."""
    changed = differences(finished, now, defaults)
    if not changed:
        return True, f"{where} is already trained with these settings; nothing to do."
    return False, (f"{where} holds a finished run with other settings: {'; '.join(changed)}. Nothing was started: "
                   f"to train with these settings, start a new run with another SFT_OUTPUT_DIR (or move this "
                   f"folder away); to use the finished run, its model is in {where}/final")
