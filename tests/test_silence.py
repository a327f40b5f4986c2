"""The controller says so when the ranks make no step for long (controller/silence.py): once, then each time the
silence doubles, from rank 0's real progress file and event log; a step resets it."""

from __future__ import annotations

import os

from sft.controller.silence import Silence
from sft.events import EVENTS_FILE, PROGRESS_FILE, Progress
from sft.handoff.records import write_json

AFTER = 100.0


def test_ranks_silent_since_they_started_are_said_once_then_at_double_the_silence(tmp_path, capsys):
    quiet = Silence(tmp_path, launcher_pid=4321, after_s=AFTER)
    t0 = quiet.began
    assert quiet.look(t0 + AFTER - 1) is None
    said = quiet.look(t0 + AFTER + 1)
    assert said and "no training step for 2 min (none since the ranks started)" in said
    assert "`ps --ppid 4321`" in said and "py-spy dump" in said and said in capsys.readouterr().out
    assert quiet.look(t0 + 1.5 * AFTER) is None  # not again before the silence doubled
    assert "no training step for 4 min" in quiet.look(t0 + 2.4 * AFTER)


def test_the_silence_counts_from_rank_0s_last_progress_or_event_and_a_step_resets_it(tmp_path):
    quiet = Silence(tmp_path, launcher_pid=1, after_s=AFTER)
    t0 = quiet.began
    write_json(tmp_path / PROGRESS_FILE, Progress(step=5, max_steps=10, updated=t0 + 50).to_dict())
    assert quiet.look(t0 + 50 + AFTER - 1) is None
    assert "(the last at step 5 of 10)" in quiet.look(t0 + 50 + AFTER + 1)
    # an event (a checkpoint saved, an evaluation) is a sign of life too
    (tmp_path / EVENTS_FILE).write_text("{}\n")
    os.utime(tmp_path / EVENTS_FILE, (t0 + 200, t0 + 200))
    assert quiet.look(t0 + 200 + AFTER - 1) is None and quiet.said_at is None
    assert quiet.look(t0 + 200 + AFTER + 1) is not None  # said again: a new silence, not the doubled old one
