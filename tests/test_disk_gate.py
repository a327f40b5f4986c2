"""The disk's room for checkpoints counted from the run's own saves, once the probe has timed its steps: a run
too short for a save by time (its end writes the model alone) needs room for one checkpoint, the one a stop would
save, not SFT_SAVE_TOTAL_LIMIT + 1 (on an H100
machine the default cadence's run of Qwen3-1.7B, one save, was refused for three: 82.6 GB on a 65 GB disk)."""

from __future__ import annotations

import os

from conftest import demo_env, read_summary, run_entrypoint, tmpfs
from sft import checkpoints, exitcodes

# A checkpoint of the demo model in fp32 at ZeRO-2, as the planner sizes it (20 bytes/param): about 2.1 MB
SHORT = dict(probe_steps=5, max_steps=12, save_total_limit=2, precision="fp32", seed=0, packing="false",
             learning_rate=2e-3, logging_steps=1)


def leave_free(disk, free: int) -> None:
    """Fill the small disk until `free` bytes are left (a disk that other files took)."""
    filler = disk / "filler"
    filler.write_bytes(b"")
    now = checkpoints.free_disk(str(disk))
    with open(filler, "wb") as f:
        f.write(os.urandom(max(now - free, 0)))


def after_probe(stdout: str) -> str:
    """The check said after the probe (the line after 'after the probe:', its time stamp left out)."""
    lines = stdout.splitlines()
    said = next(i for i, line in enumerate(lines) if line.endswith("Z after the probe:"))
    return lines[said + 1].split("Z ", 1)[1]


def test_a_run_that_saves_once_needs_room_for_one_checkpoint_and_one_that_saves_more_is_refused(tmp_path):
    with tmpfs(tmp_path / "disk", "24m") as small:
        leave_free(small, 5 * 2**20)  # room for two checkpoints, not the limit's three
        out = small / "out"
        env = demo_env(tmp_path, output_dir=str(out), **SHORT)  # the default cadence: no save, final/ at the end
        result = run_entrypoint(env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "counted again after the probe, from the run's steps and its speed" in result.stdout
        assert "Z after the probe:\n" in result.stdout and after_probe(result.stdout).startswith("[ok  ] disk")
        assert "1 checkpoint of " in result.stdout and "; the run saves 0 in all" in result.stdout
        assert "and the 0.0 GB final model" in result.stdout  # written at the end, not links: counted
        assert (out / "final" / "config.json").is_file()
        assert checkpoints.complete(out) == []

        out = small / "out-every-2-steps"
        env = demo_env(tmp_path, output_dir=str(out), save_steps=2, **SHORT)  # six saves, three at once
        refused = run_entrypoint(env)
        assert refused.returncode == exitcodes.PREFLIGHT, refused.stdout[-3000:] + refused.stderr[-3000:]
        assert after_probe(refused.stdout).startswith("[fail] disk")
        assert "3 checkpoints of " in refused.stdout and "; the run saves 6 in all" in refused.stdout
        summary = read_summary(out)
        assert (summary["status"], summary["exit_code"]) == ("preflight failed", exitcodes.PREFLIGHT)
        assert checkpoints.all_checkpoints(out) == []  # stopped after the probe, before any save
