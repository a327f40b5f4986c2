"""run/events.jsonl and what `status` makes of a run's folder: typed events, one whole line each, from several
writers at once; the phase, the step and the time left, an upload in progress."""

from __future__ import annotations

import json
import re
import threading
import time

from checkpoint_layout import make_checkpoint
from sft.controller import status
from sft.events import (CheckpointSaved, Ended, EventLog, HubBehind, Progress, SettingsResolved, TrainStarted,
                        UploadProgress, read_events)
from sft.handoff import write_json


def test_each_event_is_one_json_line_with_its_utc_time_and_reads_back_typed(tmp_path):
    log = EventLog(tmp_path / "run" / "events.jsonl")
    log.emit(SettingsResolved(settings={"model": "m"}, deadline="2026-12-01T18:00:00Z", deadline_source="x"))
    log.emit(CheckpointSaved(step=8, seconds=1.25, path="/o/checkpoint-8"))
    with open(tmp_path / "run" / "events.jsonl", "a") as f:
        f.write('{"time": "2026-12-01T10:00:00Z", "event": "from a newer job"}\n{"half a li')  # skipped
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["event"] == "settings" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["time"])
    assert json.loads(lines[1]) == {"time": json.loads(lines[1])["time"], "event": "checkpoint_saved", "step": 8,
                                    "seconds": 1.25, "path": "/o/checkpoint-8"}
    found = [e for _, e in read_events(tmp_path / "run" / "events.jsonl")]
    assert found == [SettingsResolved(settings={"model": "m"}, deadline="2026-12-01T18:00:00Z", deadline_source="x"),
                     CheckpointSaved(step=8, seconds=1.25, path="/o/checkpoint-8")]


def test_writers_at_once_never_interleave(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    big = {f"k{i}": "x" * 200 for i in range(20)}  # 4 kB lines

    def write(n: int) -> None:
        for i in range(200):
            log.emit(SettingsResolved(settings={**big, "writer": n, "i": i}))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 800 and all(json.loads(line)["settings"]["k0"] == "x" * 200 for line in lines)


def test_status_of_a_run_in_training_with_an_upload_going_on(tmp_path):
    out = tmp_path / "out"
    log = EventLog(out / "run" / "events.jsonl")
    log.emit(SettingsResolved(settings={}))
    log.emit(TrainStarted(stage="2", max_steps=-1))
    log.emit(HubBehind(checkpoints=1, minutes=2.0, newest_on_hub="checkpoint-100"))
    make_checkpoint(out, 200)
    make_checkpoint(out, 300, complete=False)  # a save in progress: not the newest complete one
    write_json(out / "run" / "progress.json", Progress(step=310, max_steps=1000, seconds_per_step=0.6).to_dict())
    write_json(out / "run" / "upload.json", UploadProgress(folder="checkpoint-200", bytes_total=4_000_000_000,
                                                           bytes_sent=1_000_000_000, seconds=10.0).to_dict())
    now = status.of_folder(out)
    assert (now.phase, now.step, now.max_steps, now.eta_seconds) == ("training", 310, 1000, 414.0)
    assert (now.checkpoint_on_disk, now.checkpoint_on_hub, now.final_model) == ("checkpoint-200", "checkpoint-100",
                                                                               False)
    text = now.text()
    assert "training: step 310 of 1000, about 7 min left" in text
    assert "uploading: checkpoint-200: uploading 1.0 GB of 4.0 GB (25%), 100.0 MB/s, about 30 s left" in text
    log.emit(Ended(status="stopped for time", exit_code=75))
    ended = status.of_folder(out)
    assert (ended.phase, ended.ended_as, ended.exit_code, ended.upload) == ("ended", "stopped for time", 75, None)
    assert json.loads(ended.to_json())["exit_code"] == 75


def test_a_new_start_begins_a_new_status(tmp_path):
    out = tmp_path / "out"
    log = EventLog(out / "run" / "events.jsonl")
    log.emit(SettingsResolved(settings={}))
    log.emit(Ended(status="stopped for time", exit_code=75))
    time.sleep(0.01)
    log.emit(SettingsResolved(settings={}))  # the next start
    again = status.of_folder(out)
    assert again.phase == "starting" and again.exit_code is None
