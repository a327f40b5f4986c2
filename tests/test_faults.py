"""Errors that survive the fault that causes them (issue 46): a disk that really fills, leaving not a byte, at the
first save (so no complete checkpoint to measure, and the rank's own report cannot be written either), a folder
that turns read-only mid-run, a report that is missing. The user still gets the training's exit code, the sentence
that says why, and the summary where it can be written. Each on a real filesystem (tmpfs; skipped without root)."""

from __future__ import annotations

import errno
import json
import subprocess

import pytest

from conftest import demo_env, run_entrypoint, tmpfs
from sft import exitcodes
from sft.controller import failure, summary

JOB = dict(zero_stage="2", probe_steps=0, max_steps=14, save_steps=10, micro_batch=1, grad_accum=1, max_length=128,
           packing="false", precision="fp32", logging_steps=1)


def test_a_disk_filled_to_the_last_byte_at_the_first_save_says_so(tmp_path):
    """Before: the rank's report could not be written on the full disk, and the log said only "training failed
    (launcher exit code 1)"."""
    with tmpfs(tmp_path / "disk", "32m") as small:
        out = small / "out"
        env = demo_env(tmp_path, output_dir=out, **JOB)
        env["SFTTEST_FILL_DISK"] = f"10:0:{small / 'filler'}"
        done = run_entrypoint(env, timeout=600)
        assert done.returncode == exitcodes.TRAIN_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"error: the disk of {out} is full (0 GB free, less than one checkpoint: " in done.stdout
        assert "GB as planned), so the save failed: free space or mount a larger volume" in done.stdout
        assert "error: training failed (launcher exit code 1: rank 0 wrote no report; the ranks' own lines above say " \
            "what they met)" in done.stdout
        assert "removed checkpoint-10: the failure left it incomplete; a new start resumes from the beginning" \
            in done.stdout
        # not a byte left, not even for the summary: said, with the exit code
        assert f"error: could not write {out / 'run' / 'summary.json'} or the loss plot (No space left on device)" \
            in done.stdout
        assert f"failed: exit code {exitcodes.TRAIN_FAILED}" in done.stdout


def test_a_folder_turned_read_only_mid_run_says_so_with_the_trainings_exit_code(tmp_path):
    with tmpfs(tmp_path / "disk", "64m") as disk:
        out = disk / "out"
        env = demo_env(tmp_path, output_dir=out, **JOB)
        env["SFTTEST_READ_ONLY"] = f"10:{out}"
        try:
            done = run_entrypoint(env, timeout=600)
        finally:
            subprocess.run(["umount", "--lazy", str(out)], check=False)  # the read-only view over the folder
        assert done.returncode == exitcodes.TRAIN_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"error: {out} cannot be written any more (Read-only file system), so the save failed" in done.stdout
        assert f"error: could not write {out / 'run' / 'summary.json'} or the loss plot (Read-only file system)" \
            in done.stdout
        assert "checkpoint-10 is incomplete and could not be removed; a new start skips it and resumes from the " \
            "beginning" in done.stdout
        assert f"failed: exit code {exitcodes.TRAIN_FAILED}" in done.stdout
        assert "Traceback" not in done.stdout  # the controller's own lines (a rank's failure is the rank's)


def test_a_missing_report_is_said_not_left_blank(tmp_path):
    """No report from rank 0 (it could not write it, or it was killed): the failure line says so."""
    result = summary.TrainResult.of([], 1.0)
    assert result.status is None
    assert failure.no_report(1) == ": rank 0 wrote no report; the ranks' own lines above say what they met"


def test_the_write_check_tells_read_only_from_full(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        assert failure.unwritable(disk) is None
        (disk / "filler").write_bytes(b"x" * 10**6 + b"")  # as much as fits
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            assert failure.unwritable(disk).errno == errno.EROFS
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)


def test_an_event_that_cannot_be_written_is_said_once_and_the_job_goes_on(tmp_path, capsys):
    from sft.events import EventLog, StopRequested

    with tmpfs(tmp_path / "disk", "1m") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            log = EventLog(disk / "run" / "events.jsonl")
            log.emit(StopRequested(reason="signal", detail="SIGTERM"))
            log.emit(StopRequested(reason="signal", detail="SIGTERM"))
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    assert capsys.readouterr().err.count("warning: could not append to") == 1
    json.dumps({})  # nothing else raised
