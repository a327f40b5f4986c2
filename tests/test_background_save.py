"""sft/ranks/patches/background.py: a checkpoint file written while the steps go on is torch.save's file, as the
tensors were when the save was asked; it takes its name only once whole; one checkpoint is written at a time, in
memory kept from the first. The jobs of tests/test_job.py save in the background by default (the planner's auto on
CPU), so their resumes, stops, kills and full disks go through it; the kill and the stop during a slow write are
below, and a GPU's copies in tests/test_gpu.py."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

from sft import checkpoints
from sft.ranks import progress
from sft.ranks.patches import background, saving
from sft.ranks.patches import checkpoints as checkpoint_patches
from checkpoint_layout import make_checkpoint


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(9_000_000, generator=g)  # 36 MB: spans two of the arena's smallest blocks
    return {"flat": flat, "view": flat[3:50], "bf16": torch.randn(300, 70, generator=g).bfloat16(), "n": 4}


def test_the_file_is_the_tensors_as_they_were_when_saved(tmp_path, crc32_off):
    writer = background.Writer()
    folder = tmp_path / "checkpoint-5" / "global_step5"
    folder.mkdir(parents=True)
    obj = state(0)
    expected = state(0)  # the same tensors, as they are before the step below changes obj's
    assert saving.save(obj, folder / "optim.pt", writer) is True
    obj["flat"].add_(1.0)  # the next optimizer step, before the file is written
    writer.wait()
    back = torch.load(folder / "optim.pt", weights_only=False)
    assert torch.equal(back["flat"], expected["flat"]) and torch.equal(back["bf16"], expected["bf16"])
    assert back["view"].untyped_storage().data_ptr() == back["flat"].untyped_storage().data_ptr()
    (tmp_path / "ref").mkdir()  # the same name: torch.save writes it into the file
    torch.save(expected, tmp_path / "ref" / "optim.pt")
    assert (folder / "optim.pt").read_bytes() == (tmp_path / "ref" / "optim.pt").read_bytes()
    assert not list(tmp_path.rglob(f"{checkpoints.WRITING}*"))  # its folder too, once the writer waited
    [done] = writer.written()
    assert done.folder == str(tmp_path / "checkpoint-5") and done.files == 1 and done.bytes > 36_000_000


def test_a_file_being_written_keeps_its_checkpoint_incomplete(tmp_path):
    writer = background.Writer()
    writer.slower_s = 1.0
    out = tmp_path / "out"
    make_checkpoint(out, 10, ranks=1)
    assert checkpoints.problem(out / "checkpoint-10") is None
    shard = out / "checkpoint-10" / "global_step10" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.unlink()
    saving.save(state(1), shard, writer)
    assert checkpoints.problem(out / "checkpoint-10") == (
        "still being written (zero_pp_rank_0_mp_rank_00_optim_states.pt)")
    assert checkpoints.unwritten_bytes(out / "checkpoint-10") > 30_000_000  # counted before it is on the disk
    assert checkpoints.latest_complete(out) is None
    writer.wait()
    assert checkpoints.problem(out / "checkpoint-10") is None
    assert checkpoints.unwritten_bytes(out / "checkpoint-10") == 0


def test_one_checkpoint_at_a_time_in_the_same_memory(tmp_path):
    writer = background.Writer()
    for step in (1, 2, 3):
        folder = tmp_path / f"checkpoint-{step}" / f"global_step{step}"
        folder.mkdir(parents=True)
        saving.save(state(step), folder / "a.pt", writer)
        saving.save(state(step + 10), folder / "b.pt", writer)  # the same checkpoint: no wait between them
        if step == 1:
            kept = writer.arena.bytes
    writer.wait()
    assert writer.arena.bytes == kept  # the second and third took the first's memory
    assert [d.folder for d in writer.written()] == [str(tmp_path / f"checkpoint-{s}") for s in (1, 2, 3)]
    for step in (1, 2, 3):
        back = torch.load(tmp_path / f"checkpoint-{step}" / f"global_step{step}" / "b.pt", weights_only=False)
        assert torch.equal(back["flat"], state(step + 10)["flat"])


def test_a_failed_write_is_raised_in_the_training_thread_and_leaves_no_file(tmp_path):
    writer = background.Writer()
    writer.slower_s = 0.5
    folder = tmp_path / "checkpoint-7" / "global_step7"
    folder.mkdir(parents=True)
    saving.save(state(2), folder / "optim.pt", writer)
    for skeleton in (folder / f"{checkpoints.WRITING}-0").iterdir():  # taken away under the writer
        skeleton.unlink()
    try:
        writer.wait()
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("the failed write was not raised")
    writer.check()  # raised once
    assert not any(folder.rglob("*.pt"))


def test_rotation_keeps_the_complete_checkpoint_while_the_newest_is_written(tmp_path):
    import transformers.trainer

    checkpoint_patches.rotation_keeps_a_complete_one()
    out = tmp_path / "out"
    make_checkpoint(out, 10, ranks=1)
    make_checkpoint(out, 20, ranks=1)
    (out / "checkpoint-20" / f"{checkpoints.WRITING}-1").mkdir()
    (out / "checkpoint-20" / f"{checkpoints.WRITING}-1" / "latest").write_text("")  # still being written
    transformers.trainer.rotate_checkpoints(output_dir=str(out), save_total_limit=1, use_mtime=False)
    assert [p.name for p in checkpoints.all_checkpoints(out)] == ["checkpoint-10", "checkpoint-20"]
    (out / "checkpoint-20" / f"{checkpoints.WRITING}-1" / "latest").unlink()
    transformers.trainer.rotate_checkpoints(output_dir=str(out), save_total_limit=1, use_mtime=False)
    assert [p.name for p in checkpoints.all_checkpoints(out)] == ["checkpoint-20"]


@pytest.fixture
def process_writer():
    """The process's writer, as a rank with background saves has it, and none again after the test."""
    yield background.start()
    background._writer = None


def test_a_checkpoints_safetensors_written_in_the_background_is_read_by_safetensors(tmp_path, process_writer):
    from safetensors import safe_open
    from safetensors.torch import load_file

    import transformers.modeling_utils

    checkpoint_patches.checkpoint_weights_in_background()
    writer = process_writer
    tensors = {"b.weight": torch.randn(30, 7).bfloat16(), "a.bias": torch.arange(5, dtype=torch.int64),
               "mask": torch.tensor([True, False]), "empty": torch.empty(0, 3), "t": torch.randn(4, 6).t()}
    expected = {k: v.clone() for k, v in tensors.items()}
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    transformers.modeling_utils.safe_save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tensors["b.weight"].add_(1)  # the next step
    assert checkpoints.problem(folder) in ("no trainer_state.json",)  # a Trainer's folder before its state
    writer.wait()
    back = load_file(folder / "model.safetensors")
    assert back.keys() == expected.keys() and all(torch.equal(back[k], expected[k]) for k in expected)
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}
    (tmp_path / "final").mkdir()  # the final model: written at once, by safetensors itself
    final = {k: v.contiguous() for k, v in expected.items()}  # as save_pretrained hands them over
    transformers.modeling_utils.safe_save_file(final, str(tmp_path / "final" / "model.safetensors"))
    assert (tmp_path / "final" / "model.safetensors").is_file() and not list((tmp_path / "final").glob(f"{checkpoints.WRITING}*"))


def test_retire_renames_what_the_newest_complete_ones_leave_and_never_a_complete_newest(tmp_path):
    out = tmp_path / "out"
    for step in (10, 20, 30):
        make_checkpoint(out, step, ranks=1)
    (out / "checkpoint-30" / f"{checkpoints.WRITING}-0").mkdir()
    (out / "checkpoint-30" / f"{checkpoints.WRITING}-0" / "latest").write_text("")  # 30 still being written
    assert checkpoints.retire(out, 1) == [out / f"{checkpoints.REMOVING}-checkpoint-10"]  # 20 is what a resume needs
    assert [p.name for p in checkpoints.all_checkpoints(out)] == ["checkpoint-20", "checkpoint-30"]
    assert checkpoints.latest_complete(out) == out / "checkpoint-20"  # the retired one is out of sight at once
    (out / "checkpoint-30" / f"{checkpoints.WRITING}-0" / "latest").unlink()
    make_checkpoint(out, 40, ranks=1)
    assert checkpoints.retire(out, 1, protected=str(out / "checkpoint-20")) == [
        out / f"{checkpoints.REMOVING}-checkpoint-30"]  # the Trainer's best stays
    assert checkpoints.retire(out, 5) == []
    retired = checkpoints.being_removed(out)
    held = out / "run" / "upload-staging" / "shard.pt"  # the uploader's hard link to a file it is sending
    held.parent.mkdir(parents=True)
    shard = next(p for p in retired[0].rglob("*") if p.is_file() and p.stat().st_size > 0)
    held.hardlink_to(shard)
    everything = sum(checkpoints.folder_bytes(p) for p in retired)
    assert checkpoints.freed_by_removal(out) == everything - shard.stat().st_blocks * 512 > 0
    checkpoints.remove_retired(out)
    assert checkpoints.being_removed(out) == [] and [p.name for p in out.iterdir()] != []


def test_the_retired_are_removed_behind_the_next_snapshot_and_other_ranks_wait_for_it(tmp_path):
    """The remover's clear is queued before the next checkpoint's files and does not hold the snapshot; a rank that
    does not remove writes its files only once they are gone."""
    out = tmp_path / "out"
    make_checkpoint(out, 10, ranks=1)
    make_checkpoint(out, 20, ranks=1)
    [retired] = checkpoints.retire(out, 1)
    waiting = background.Writer()
    waiting.clear(out, remover=False)
    folder = out / "checkpoint-30"
    folder.mkdir()
    saving.save(state(2), folder / "optim.pt", waiting)  # its snapshot returns: the clear does not hold it
    assert retired.exists() and not (folder / "optim.pt").exists()  # its file waits for the removal
    remover = background.Writer()
    remover.clear(out, remover=True)
    remover.wait()
    waiting.wait()
    assert not retired.exists() and (folder / "optim.pt").is_file()


def test_at_a_finished_runs_end_the_removal_goes_on_behind_the_rank_and_the_controller_ends_it(tmp_path):
    """The end's removal is handed to a process of its own (the ranks then exit without waiting for it), by the
    remover only; the controller's remove_retired after the launch leaves none, whatever that process has done."""
    out = tmp_path / "out"
    for step in (10, 20, 30):
        make_checkpoint(out, step, ranks=1)
    retired = checkpoints.retire(out, 1)
    assert len(retired) == 2
    background.removal_behind(out, remover=False)
    time.sleep(0.5)
    assert all(p.exists() for p in retired)  # another rank: nothing is started
    background.removal_behind(out, remover=True)
    deadline = time.monotonic() + 30
    while checkpoints.being_removed(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoints.being_removed(out) == []  # removed by the process it started, this rank doing nothing
    assert [p.name for p in checkpoints.all_checkpoints(out)] == ["checkpoint-30"]
    make_checkpoint(out, 40, ranks=1)
    assert len(checkpoints.retire(out, 1)) == 1
    background.removal_behind(out, remover=True)
    checkpoints.remove_retired(out)  # the controller's, while that process may still be removing
    assert checkpoints.being_removed(out) == []
    assert [p.name for p in checkpoints.all_checkpoints(out)] == ["checkpoint-40"]


def test_a_disk_for_two_checkpoints_holds_a_run_of_many_saved_in_the_background(tmp_path):
    """SFT_SAVE_TOTAL_LIMIT=1 on a disk with room for the kept checkpoint, the one being written and the final
    model, as the disk preflight counts, and not for a third: every save of the run fits. Before, the oldest was
    removed only after the next save's files had begun, so the third save filled the disk (a GPU machine's 64 GB
    disk with Qwen3-1.7B)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import DEMO_MODEL, demo_env, read_summary, run_entrypoint, tmpfs
    from sft.planner import disk

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(DEMO_MODEL))
    per_param, _ = disk.checkpoint_bytes_per_param(False, 2, "adamw")
    planned = per_param * model.num_parameters()  # the real one is 0.9x-1.25x of it (tests/test_job.py)
    with tmpfs(tmp_path / "disk", "64m") as small:
        out = small / "out"
        env = demo_env(tmp_path, zero_stage="2", probe_steps=5, save_steps=20, save_total_limit=1, logging_steps=1,
                       learning_rate=2e-3, precision="fp32", seed=0, packing="false")
        # before the save at step 40, with checkpoint-20 kept: room for one more and the final model, not two more
        env.update(SFT_OUTPUT_DIR=str(out), SFTTEST_FILL_DISK=f"40:{int(1.7 * planned)}:{small / 'filler'}")
        result = run_entrypoint(env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        summary = read_summary(out)
        assert [p.name for p in checkpoints.all_checkpoints(out)] == ["checkpoint-64"]
        assert checkpoints.problem(out / "checkpoint-64") is None and checkpoints.being_removed(out) == []
        assert summary["train"]["global_step"] == 64 and (out / "final" / "config.json").is_file()
        assert "[rank 0] disk after checkpoint-60:" in result.stdout  # a save after the disk filled


def test_the_room_after_a_save_waits_for_a_disk_that_counts_removed_blocks_free_late(tmp_path, monkeypatch):
    """On an H100 machine's disk, free space read during a retired checkpoint's removal lacked its blocks, and the
    check stopped a run that fit. Where the retired bytes would make the room, the check waits for the disk (up to
    SETTLE_S); where they could not, or nothing was retired, it answers at once."""
    out, size, late = tmp_path / "out", 32 << 20, [0]
    for step in (10, 20):
        make_checkpoint(out, step, ranks=1, extra={"weights.bin": os.urandom(size)})
    checkpoints.retire(out, 1)
    retired = checkpoints.freed_by_removal(out)
    checkpoints.remove_retired(out)  # behind the steps, while the newest is written
    make_checkpoint(out, 30, ranks=1, extra={"weights.bin": os.urandom(size)})
    newest = checkpoints.folder_bytes(out / "checkpoint-30")
    args = SimpleNamespace(output_dir=str(out), save_total_limit=2, bf16=True, load_best_model_at_end=False,
                           save_strategy="steps")  # the end saves one, and final/ is links to it
    state, model = SimpleNamespace(global_step=30, max_steps=100), torch.nn.Linear(4, 4)

    def a_disk(room: int, lag_s: float) -> None:
        """A disk of its own (other tests write beside this one) with `room` past what the run needs once the removed
        blocks count, which it counts `lag_s` after now."""
        capacity = checkpoints.folder_bytes(tmp_path) + newest + room  # one checkpoint more, final/ as links
        late[0], given_back = retired, time.monotonic() + lag_s
        monkeypatch.setattr(checkpoints, "free_disk", lambda _: capacity - checkpoints.folder_bytes(tmp_path)
                            - (late[0] if time.monotonic() < given_back else 0))

    monkeypatch.setattr(progress, "SETTLE_S", 3.0)
    a_disk(room=1 << 20, lag_s=1.0)
    began = time.monotonic()
    fits, why = progress.room_after(args, state, model, every=10, retired=retired)
    assert fits and 1.0 <= time.monotonic() - began < 3.0, why
    a_disk(room=1 << 20, lag_s=1.0)
    assert not progress.room_after(args, state, model, every=10)[0]  # nothing retired: no wait, as before
    a_disk(room=-(1 << 20), lag_s=0.0)  # short by 1 MiB, the removed blocks counted
    began = time.monotonic()
    fits, why = progress.room_after(args, state, model, every=10, retired=retired)
    assert not fits and time.monotonic() - began >= 3.0 and "stops now, at this complete checkpoint" in why
    a_disk(room=-(2 * retired), lag_s=100.0)  # short by more than the removal gives back: no wait
    began = time.monotonic()
    assert not progress.room_after(args, state, model, every=10, retired=retired)[0]
    assert time.monotonic() - began < 1.0
