"""The settings of running the job as a service, checked: the trackers (SFT_REPORT_TO), the budget (SFT_MAX_HOURS,
SFT_MAX_COST), the time limit (SFT_TIME_LIMIT) and the Hub branch (SFT_HUB_REVISION). Called by settings.check,
so every problem is reported with the others, in the same form."""

from __future__ import annotations

import re

from .planner.deadline import parse_limit
from .settings import Settings, _bad
from .tracking import problems as tracker_problems

BRANCH = re.compile(r"^(?!.*\.\.)(?!.*//)[A-Za-z0-9][\w./-]*(?<![./])$")  # a git branch name, as the Hub takes one


def service_problems(s: Settings) -> list[str]:
    """Trackers, the budget and the time limit, the Hub branch: each named in one line."""
    problems = [_bad("SFT_REPORT_TO", s.report_to, why) for why in tracker_problems(s.report_to)]
    if s.max_cost is not None and s.price_per_hour is None:
        problems.append(_bad("SFT_MAX_COST", s.max_cost, "needs SFT_PRICE_PER_HOUR, the machine's price per hour"))
    if (s.max_hours is not None or s.max_cost is not None) and s.probe_steps == 0:
        problems.append(_bad("SFT_PROBE_STEPS", 0, "SFT_MAX_HOURS and SFT_MAX_COST are checked against the probe's "
                             "projection: keep the probe (SFT_PROBE_STEPS above 0), or unset the cap"))
    if s.time_limit is not None:
        try:
            parse_limit(s.time_limit, 0.0)
        except ValueError as e:
            problems.append(_bad("SFT_TIME_LIMIT", s.time_limit, str(e)))
    if s.hub_revision is not None and s.hub_repo is None:
        problems.append(_bad("SFT_HUB_REVISION", s.hub_revision, "needs SFT_HUB_REPO, the repo it is a branch of"))
    elif s.hub_revision is not None and not BRANCH.match(s.hub_revision):
        problems.append(_bad("SFT_HUB_REVISION", s.hub_revision, "expected a branch name such as run-2 or exp/lr-1e-5"))
    return problems
