"""The time limit's and the budget's rules (sft/planner/deadline.py, budget.py): pure, so tables of cases."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sft.planner.budget import Budget, Projection, gate, steps_that_fit
from sft.settings.times import parse_limit, parse_slurm_end
from sft.planner.deadline import MARGIN_S, SAFETY, Clock, Deadline, earliest, \
    stop_for_time

START = 1_800_000_000.0  # a job's start, epoch seconds


@pytest.mark.parametrize("text, seconds", [
    ("3h30m", 3.5 * 3600), ("90m", 5400), ("45s", 45), ("1d2h", 26 * 3600), ("1.5h", 5400), ("2H", 7200),
])
def test_a_duration_counts_from_the_start(text, seconds):
    assert parse_limit(text, START) == START + seconds


@pytest.mark.parametrize("text, at", [
    ("2026-12-01T18:00:00Z", datetime(2026, 12, 1, 18, tzinfo=timezone.utc)),
    ("2026-12-01T18:00:00+01:00", datetime(2026, 12, 1, 17, tzinfo=timezone.utc)),
    ("2026-12-01T18:00:00", datetime(2026, 12, 1, 18, tzinfo=timezone.utc)),  # no zone: UTC
])
def test_an_end_time_is_absolute(text, at):
    assert parse_limit(text, START) == at.timestamp()


@pytest.mark.parametrize("text", ["", "3 hours", "h", "-5m", "tomorrow", "0s"])
def test_a_bad_limit_says_what_is_accepted(text):
    with pytest.raises(ValueError, match="expected a duration"):
        parse_limit(text, START)


@pytest.mark.parametrize("text, at", [
    ("1800003600", 1800003600.0),  # SLURM_JOB_END_TIME: epoch seconds
    ("2027-01-15T10:20:30", datetime(2027, 1, 15, 10, 20, 30, tzinfo=timezone(timedelta(hours=2))).timestamp()),
    (None, None), ("", None), ("N/A", None), ("Unknown", None), ("0", None),
])
def test_slurm_end_time(text, at):
    # squeue's %e is the cluster's local time, here UTC+2
    assert parse_slurm_end(text, local_zone=timezone(timedelta(hours=2))) == at


def test_the_earliest_limit_wins():
    mine, slurm = Deadline(START + 100, "SFT_TIME_LIMIT=100s"), Deadline(START + 50, "SLURM_JOB_END_TIME")
    assert earliest(mine, slurm) is slurm and earliest(None, mine) is mine and earliest(None, None) is None


NEEDS = SAFETY * (2 + 30 + 120) + MARGIN_S  # a step 2 s, a save 30 s, an upload 120 s


@pytest.mark.parametrize("left, steps_left, stop, why", [
    (3600, None, False, "s left; a stop needs"),
    (NEEDS + 1, None, False, "s left; a stop needs"),
    (NEEDS, None, True, "before the time limit, and a stop needs a step 2.0 s, a save 30.0 s, an upload 120.0 s"),
    (60, None, True, "before the time limit"),
    (-5, None, True, "before the time limit"),  # past it already: stop at once
    # near the end: the rest of the run fits, so it is not cut short for a checkpoint
    (SAFETY * (20 * 2 + 30 + 200) + MARGIN_S, 20, False, "the run ends before the limit"),
    (SAFETY * (20 * 2 + 30 + 200) + MARGIN_S - 1, 20, False, "s left; a stop needs"),  # not yet: it is far
    (NEEDS, 20, True, "before the time limit"),
])
def test_stop_for_time(left, steps_left, stop, why):
    call = stop_for_time(Clock(left=left, step=2, save=30, upload=120, steps_left=steps_left, final=200))
    assert call.stop is stop and why in call.reason and call.needed == NEEDS


def test_without_a_hub_no_upload_is_waited_for():
    with_hub = stop_for_time(Clock(left=200, step=2, save=30, upload=120))
    alone = stop_for_time(Clock(left=200, step=2, save=30))
    assert with_hub.stop and not alone.stop and "upload" not in alone.reason


# -- the budget ----------------------------------------------------------------------------------

# 1,000 steps of 3.6 s (1 h), a save of 36 s every 100 steps (0.1 h), a final model of 360 s (0.1 h): 1.2 h
RUN = Projection(total_steps=1000, seconds_per_step=3.6, save_steps=100, save_seconds=36, final_seconds=360,
                 price_per_hour=10.0)


def test_the_projection_counts_steps_saves_evaluation_and_the_final_model():
    assert RUN.hours() == pytest.approx(1.2) and RUN.cost() == pytest.approx(12.0)
    assert RUN.hours(500) == pytest.approx(0.5 + 0.05 + 0.1)
    with_eval = Projection(1000, 3.6, 100, 36, 360, eval_seconds=720, price_per_hour=10.0)
    assert with_eval.hours() == pytest.approx(1.4) and with_eval.hours(500) == pytest.approx(0.75)


@pytest.mark.parametrize("budget, verdict, max_steps, fits", [
    (Budget(), "none", None, ()),
    (Budget(max_hours=2), "within", None, ()),
    (Budget(max_hours=1.2), "within", None, ()),
    (Budget(max_cost=12), "within", None, ()),
    (Budget(max_hours=0.65), "refuse", None, ("SFT_MAX_STEPS=500", "SFT_BUDGET_ACTION=truncate",
                                              "about 2 GPUs instead of 1", "SFT_MAX_HOURS=1.2")),
    (Budget(max_hours=0.65, action="truncate"), "truncate", 500, ("SFT_MAX_STEPS=500", "about 2 GPUs")),
    (Budget(max_cost=6.5, action="truncate"), "truncate", 500, ("SFT_MAX_STEPS=500", "SFT_MAX_COST=12")),
    (Budget(max_cost=6.5), "refuse", None, ("SFT_MAX_STEPS=500", "SFT_BUDGET_ACTION=truncate", "SFT_MAX_COST=12")),
    (Budget(max_hours=2, max_cost=6.5, action="truncate"), "truncate", 500, ()),  # the tighter cap binds
    (Budget(max_hours=0.1, action="truncate"), "refuse", None, ("SFT_MAX_HOURS=1.2",)),  # the final model alone
])
def test_budget_gate(budget, verdict, max_steps, fits):
    call = gate(RUN, budget, ranks=1)
    assert (call.verdict, call.max_steps) == (verdict, max_steps)
    for words in fits:
        assert any(f.startswith(words) for f in call.fits), (words, call.fits)
    if verdict == "refuse":
        assert "exceeds" in call.reason and "1000 steps" in call.reason
    if max_steps:
        assert RUN.seconds(max_steps) <= 0.65 * 3600 < RUN.seconds(max_steps + 1)
    if verdict == "truncate":
        assert "GPUs" not in " ".join(call.fits) or budget.max_hours is not None


def test_steps_that_fit_count_whole_saves():
    # 440 steps: 1,584 s + 5 saves of 36 s (at 100, 200, 300, 400, and the Trainer's at the last step) + 360 s =
    # 2,124 s; 400 steps end on a save of their own (4 saves). Before, the last step's save was not counted.
    assert steps_that_fit(RUN, 2124) == 440 and steps_that_fit(RUN, 2123.9) == 439
    assert RUN.saves(440) == 5 and RUN.saves(400) == 4 and RUN.saves() == 10 and RUN.saves(0) == 0
    assert steps_that_fit(RUN, 100) == 0


@pytest.mark.parametrize("stage, bytes_per_param", [("2", 16), ("3", 14)])
def test_the_projection_and_the_time_limit_size_a_checkpoint_as_preflight_does(stage, bytes_per_param):
    """From the decision's stage, precision and optimizer, as preflight sizes the disk. Before, the budget and the
    time limit took the seed's ZeRO-3 size (14 bytes/param) for every run: 56.3 GB for a Qwen3-4B ZeRO-2
    checkpoint that measured 65.1 GB on an H200, while preflight asked room for 64.4 GB."""
    from sft.controller import budget, preflight
    from sft.planner.deadline import ASSUMED_SAVE_BYTES_PER_S
    from test_decide import Q4, decided

    d = decided(zero_stage=stage)
    checkpoint, final = budget.sizes(d, Q4.total_params, {})
    needs = preflight.Needs.of(d, Q4.total_params, 2, end_saves=True)
    assert checkpoint == round(needs.checkpoint_bytes_per_param * Q4.total_params) == bytes_per_param * Q4.total_params
    assert final == 2 * Q4.total_params  # the bf16 model in final/
    assert budget.overheads(d, Q4.total_params, {}, uploads=False).save_seconds == checkpoint / ASSUMED_SAVE_BYTES_PER_S
    adafactor = budget.sizes(d, Q4.total_params, {"optim": "adafactor"})[0]  # no optimizer state to save
    assert adafactor == (bytes_per_param - 8) * Q4.total_params
