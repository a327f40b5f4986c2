"""SFT_TIME_LIMIT and SLURM's end time, read as epoch seconds (planner/deadline.py decides when to stop for them)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

DURATION = re.compile(r"^(?:(?P<d>\d+(?:\.\d+)?)d)?(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?"
                      r"(?:(?P<s>\d+(?:\.\d+)?)s)?$")
UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_limit(text: str, started: float) -> float:
    """SFT_TIME_LIMIT as epoch seconds: '3h30m', '90m', '45s', '1d2h' from `started`, or an ISO 8601 end time
    ('2026-12-01T18:00:00Z'; one without a zone is UTC). Raises ValueError saying what is accepted."""
    text = text.strip()
    match = DURATION.match(text.lower())
    if text and match and any(match.groupdict().values()):
        seconds = sum(float(v) * UNIT_SECONDS[k] for k, v in match.groupdict().items() if v)
        if seconds <= 0:
            raise ValueError("expected a duration above zero")
        return started + seconds
    try:
        end = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("expected a duration such as 3h30m, 90m or 45s, or an end time such as "
                         "2026-12-01T18:00:00Z") from None
    if end.tzinfo is None:
        end = end.replace(tzinfo=timezone.utc)
    return end.timestamp()


def parse_slurm_end(text: str | None, local_zone: timezone | None = None) -> float | None:
    """SLURM's end time of the job: SLURM_JOB_END_TIME's epoch seconds, or squeue's %e ('2026-10-07T15:36:06',
    in the cluster's local time); None when there is none (unset, 'N/A', 'Unknown', an unlimited job)."""
    if not text or not text.strip():
        return None
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return float(text) if int(text) > 0 else None
    try:
        end = datetime.fromisoformat(text)
    except ValueError:
        return None
    if end.tzinfo is None:
        end = end.replace(tzinfo=local_zone) if local_zone else end.astimezone()  # naive: the local time
    return end.timestamp()
