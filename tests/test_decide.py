"""The decision as a table of cases: settings + machine + checkpoint record -> every choice, with its reason.
Pure: no file, no GPU, no rank is started."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from sft import exitcodes, stages
from sft.handoff import CheckpointRecord, DataPlan, DataSource, Split
from sft.planner import data as data_rules
from sft.planner import decide, disk, escalation, restart, rules
from sft.planner.inputs import GPU, CannotRun, DataFacts, Inputs, Machine
from sft.planner.shape import ModelShape
from sft.settings import Settings

GIB = 2**30
Q4 = ModelShape("Qwen3-4B", 4_022_468_096, 388_956_160, 2560, 9728, 36, 32, 8, 128, 151936, qk_norm=True)
Q8 = ModelShape("Qwen3-8B", 8_190_735_360, 622_329_856, 4096, 12288, 36, 32, 8, 128, 151936, qk_norm=True)
TINY = ModelShape("tiny", 120_000, 32_000, 64, 128, 2, 4, 2, 16, 500)
H200 = GPU("NVIDIA H200", int(140.4 * GIB))
H100 = GPU("NVIDIA H100 80GB HBM3", int(79.25 * GIB))
ONE_H200 = Machine(gpus=(H200,), host_memory_bytes=120 * GIB, memlock_bytes=None, liger_installed=True)
CPU_HOST = Machine(gpus=(), host_memory_bytes=20 * GIB, memlock_bytes=8 * 2**20, liger_installed=False)
SEED_OFFLOAD = stages.shipped_config("3-offload")  # the seed guide's ds_zero3_offload.json, as the job ships it


def inputs_of(s: Settings, machine, shape, record=None, user_config=None, **more) -> Inputs:
    """The decision's inputs, its ranks chosen as every start chooses them (rules.choose_ranks)."""
    return Inputs(s, machine, shape, rules.choose_ranks(s, machine), record, user_config, **more)


def decided(shape=Q4, machine=ONE_H200, record=None, user_config=None, **settings):
    return decide.decide(inputs_of(Settings(**settings), machine, shape, record, user_config))


def split_of(d) -> tuple[int, int, bool]:
    return d.split.micro_batch, d.split.grad_accum, d.split.gradient_checkpointing


def test_the_defaults_on_one_h200():
    d = decided()
    assert (d.stage.name, d.bf16, d.attention, d.compile, d.liger, d.pin_memory, d.launcher) == (
        "2", True, "flex_attention", True, False, True, "torchrun")
    assert split_of(d) == (4, 1, False) and d.search == () and not d.searched
    assert d.reasons["stage"].startswith("auto: ZeRO-2, the lowest option that fits")
    assert d.reasons["gradient_checkpointing"].startswith("off, auto: ZeRO-2 fits without it")
    assert "nothing to time" in d.reasons["batch_search"]
    # the shipped config with overlap_comm off: one rank has nothing to reduce while the backward runs
    shipped = stages.shipped_config("2")
    assert d.ds_config == {**shipped, "zero_optimization": {**shipped["zero_optimization"], "overlap_comm": False}}
    assert d.row == d.plan.row("2") and d.reasons["overlap_comm"].startswith("off: one rank")
    assert set(d.reasons) >= {"ranks", "precision", "attention", "liger", "stage", "split", "pin_memory",
                              "gradient_checkpointing", "batch_search", "launcher"}


def test_an_explicit_stage_is_kept_even_where_auto_would_pick_another():
    d = decided(zero_stage="3")
    assert d.stage.name == "3" and d.reasons["stage"] == "ZeRO-3 (SFT_ZERO_STAGE)"
    assert d.ds_config == stages.shipped_config("3")


def test_a_users_deepspeed_file_decides_the_stage_and_its_offload():
    d = decided(ds_config="/x/ds_zero3_offload.json", user_config=SEED_OFFLOAD)
    assert (d.stage.name, d.offload) == ("3-offload", True)
    assert d.reasons["stage"] == "ZeRO-3-offload, as your DeepSpeed file says (SFT_DS_CONFIG)"
    assert d.row.host > 0 and d.pin_memory  # ulimit -l unlimited
    plain = copy.deepcopy(stages.shipped_config("2"))
    plain["zero_optimization"].update(reduce_bucket_size=5e7, overlap_comm=False)  # as the plan's row at one rank
    mine = decided(ds_config="/x/mine.json", user_config=plain)
    assert (mine.stage.name, mine.offload, mine.ds_config) == ("2", False, plain)
    assert mine.row.buckets < mine.plan.row("2").buckets  # planned with the user's buckets, not the shipped


def test_offload_with_a_low_memlock_turns_pin_memory_off_in_the_config():
    machine = Machine(gpus=(H200,), host_memory_bytes=120 * GIB, memlock_bytes=64 * 1024)
    d = decided(machine=machine, ds_config="/x/offload.json", user_config=SEED_OFFLOAD)
    assert d.pin_memory is False and "pin_memory will be turned off" in d.reasons["pin_memory"]
    assert d.ds_config["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    assert SEED_OFFLOAD["zero_optimization"]["offload_optimizer"]["pin_memory"] is True  # not changed in place
    assert decided(machine=machine).pin_memory is True  # ZeRO-2 pins nothing large


def test_a_resume_keeps_the_checkpoints_stage_and_split():
    record = CheckpointRecord("3", 1, Split(2, 2, True))
    d = decided(record=record)
    assert d.stage.name == "3" and d.reasons["stage"] == "ZeRO-3 (the checkpoint resumed)"
    assert split_of(d) == (2, 2, True) and d.searched and d.search == ()
    assert d.record() == record
    plain = decided(record=CheckpointRecord("2", 1))
    assert split_of(plain) == (4, 1, False) and not plain.searched  # auto checkpointing decides again


FOUR_H200 = Machine(gpus=(H200,) * 4, host_memory_bytes=400 * GIB)
RESHARD = [
    # machine, settings, the checkpoint's record -> each rank's split after (micro-batch, accumulation)
    (CPU_HOST, dict(cpu_ranks=1), CheckpointRecord("2", 2), (4, 2)),  # 2 ranks x 4 x 1 -> 1 x 4 x 2
    (CPU_HOST, dict(cpu_ranks=2, micro_batch=1, grad_accum=4), CheckpointRecord("3", 1), (1, 2)),  # 1 x 1 x 4
    (ONE_H200, {}, CheckpointRecord("3", 2, Split(2, 2, True)), (2, 4)),  # a batch search's split, its checkpointing
    (FOUR_H200, {}, CheckpointRecord("2", 2), (2, 1)),  # 8 rows over 4: the micro-batch shrinks to 2
]


@pytest.mark.parametrize("machine,settings,record,after", RESHARD)
def test_a_resume_on_another_number_of_ranks_converts_and_keeps_the_global_batch(machine, settings, record, after):
    d = decided(shape=TINY if machine is CPU_HOST else Q4, machine=machine, record=record, **settings)
    change = d.reshard
    assert (change.from_world, change.to_world) == (record.world_size, d.ranks.world) != (1, 1)
    assert split_of(d)[:2] == (change.after.micro_batch, change.after.grad_accum) == after
    assert d.ranks.world * d.split.rows == record.world_size * change.before.rows == change.rows
    assert d.ds_config["checkpoint"] == {"load_universal": True}  # this start loads the converted checkpoint
    assert d.stage.name == record.stage and d.reasons["stage"].endswith("(the checkpoint resumed)")
    assert d.reasons["reshard"].startswith(f"convert from {record.world_size} to {d.ranks.world} rank")
    assert f"keep its {change.rows} rows per step" in d.reasons["reshard"]
    if record.batch is not None:
        assert d.split.gradient_checkpointing == record.batch.gradient_checkpointing
    # its checkpoints record the new ranks and the split, which a later resume on as many ranks keeps as it is
    written = d.record()
    assert (written.world_size, written.batch) == (d.ranks.world, d.split)
    again = decided(shape=TINY if machine is CPU_HOST else Q4, machine=machine, record=written, **settings)
    assert again.reshard is None and again.split == d.split and "checkpoint" not in again.ds_config
    assert again.reasons["split"].endswith("as the checkpoint resumed records it (its batch search's, or its rows "
                                           "per step kept on another number of ranks)")


def test_a_resume_on_as_many_ranks_converts_nothing():
    d = decided(shape=TINY, machine=CPU_HOST, record=CheckpointRecord("2", 2))
    assert d.reshard is None and "reshard" not in d.reasons and "checkpoint" not in d.ds_config


def test_fewer_ranks_that_the_plan_says_cannot_hold_the_checkpoints_stage_are_warned_of():
    # Qwen3-8B at ZeRO-2 written by 8 H200s: one holds all of its optimizer state (a resume runs no probe)
    d = decided(shape=Q8, record=CheckpointRecord("2", 8))
    assert d.reshard.to_world == 1 and not d.row.fits
    why = d.reasons["reshard"]
    assert f"; warning: the plan predicts ZeRO-2 is {d.row.why} on these ranks" in why
    assert why.endswith("so training may run out of memory (exit 6): start on more GPUs")
    assert "warning" not in decided(shape=Q4, record=CheckpointRecord("2", 2)).reasons["reshard"]


def test_a_checkpoint_with_8bit_state_resumes_on_its_own_ranks_and_is_refused_on_others():
    d = decided(record=CheckpointRecord("2-8bit", 1))  # the option the checkpoint records: its optimizer too
    assert d.stage.name == "2-8bit" and d.reshard is None and d.reasons["stage"] == (
        "ZeRO-2 8-bit AdamW (the checkpoint resumed)")
    with pytest.raises(CannotRun) as e:
        decided(record=CheckpointRecord("2-8bit", 2))
    assert e.value.exit_code == exitcodes.PREFLIGHT
    assert "written by 2 ranks with 8-bit AdamW state (ZeRO-2 8-bit AdamW)" in str(e.value)
    assert str(e.value).endswith("Resume on 2 ranks (SFT_GPUS), or start a new run")


def test_a_global_batch_that_the_new_ranks_cannot_share_evenly_is_refused():
    three = Machine(gpus=(H200,) * 3, host_memory_bytes=400 * GIB)
    with pytest.raises(CannotRun) as e:
        decided(machine=three, record=CheckpointRecord("2", 2))  # 2 ranks x 4 x 1: 8 rows per step
    assert e.value.exit_code == exitcodes.PREFLIGHT
    assert str(e.value).startswith("the checkpoint to resume was trained with 8 rows per optimizer step (2 ranks x "
                                   "4 x 1: ranks x micro-batch x accumulation), which 3 ranks cannot share evenly")
    assert "Start on a number of ranks that divides 8 (1, 2, 4, 8; SFT_GPUS)" in str(e.value)


def test_a_cpu_host_runs_cpu_ranks_and_says_sft_gpus_is_ignored():
    d = decided(shape=TINY, machine=CPU_HOST, gpus="0,1")
    assert (d.ranks.count, d.ranks.gpus, d.bf16, d.attention, d.liger) == (2, (), False, "sdpa", False)
    assert "SFT_GPUS=0,1 ignored: this machine has no GPU" in d.reasons["ranks"]
    assert d.search == ()  # auto searches on GPUs only
    searched = decided(shape=TINY, machine=CPU_HOST, batch_search="true")
    assert searched.search == (Split(4, 1, False), Split(2, 2, False), Split(1, 4, False))


def test_sft_gpus_naming_a_gpu_that_is_not_there():
    with pytest.raises(CannotRun) as e:
        decided(gpus="0,5")
    assert e.value.exit_code == exitcodes.BAD_SETTINGS and "no GPU 5" in str(e.value)
    assert decided(machine=Machine(gpus=(H200,) * 4), gpus="1,3").ranks.gpus == (1, 3)


def test_bf16_needs_gpus():
    with pytest.raises(CannotRun) as e:
        decided(shape=TINY, machine=CPU_HOST, precision="bf16")
    assert e.value.exit_code == exitcodes.BAD_SETTINGS and "SFT_PRECISION='bf16': this machine has no GPU" in str(
        e.value)
    assert decided(precision="bf16").reasons["precision"] == "bf16 (SFT_PRECISION)"


def test_several_nodes_shard_over_every_rank():
    machine = Machine(gpus=(H200,) * 2, host_memory_bytes=200 * GIB, nodes=2)
    d = decided(shape=Q8, machine=machine)
    assert (d.ranks.count, d.ranks.nodes, d.ranks.world) == (2, 2, 4)
    assert d.plan.setup.total_gpus == 4 and d.record().world_size == 4


@pytest.mark.parametrize("settings,machine,record,goes_on,why", [
    ({}, ONE_H200, None, True, "the training's own launch: its first 50 steps (SFT_PROBE_STEPS) are timed"),
    ({"probe_steps": 0}, ONE_H200, None, False, None),
    ({}, ONE_H200, CheckpointRecord("2", 1), False, None),  # a resume does not probe
    ({}, Machine(gpus=(H200,) * 2, host_memory_bytes=200 * GIB, nodes=2), None, False,
     "launched apart: on 2 nodes the ranks elsewhere cannot read node 0's verdict"),
    ({"save_steps": 50}, ONE_H200, None, False,
     "launched apart: a checkpoint (SFT_SAVE_STEPS=50) would be saved before the verdict on its 50 steps"),
    ({"max_steps": 40}, ONE_H200, None, False, "launched apart: the run (SFT_MAX_STEPS=40) is no longer than it"),
    ({"max_steps": 51, "save_steps": 51}, ONE_H200, None, True, "the training's own launch"),
])
def test_the_probe_is_the_trainings_own_launch_where_its_steps_can_be_kept(settings, machine, record, goes_on, why):
    d = decided(shape=Q8 if machine.nodes > 1 else Q4, machine=machine, record=record, **settings)
    assert d.probe_goes_on is goes_on
    assert d.reasons.get("probe", "").startswith(why) if why else "probe" not in d.reasons


def test_nothing_fits_says_why_with_the_plan():
    small = Machine(gpus=(GPU("small", 8 * GIB),), host_memory_bytes=16 * GIB)
    with pytest.raises(CannotRun) as e:
        decided(shape=Q8, machine=small)
    assert e.value.exit_code == exitcodes.PREFLIGHT and e.value.plan is not None
    assert str(e.value).startswith("no ZeRO option fits this machine: nothing fits on 1 x 8 GiB")


def test_two_splits_to_time_where_checkpointing_decides_the_fastest():
    # Qwen3-8B on 2 H200s with DeepSpeed's own step (an optimizer other than torch's fused AdamW): 4 rows per pass
    # fit only with checkpointing; fewer rows fit without
    two = Machine(gpus=(H200,) * 2, host_memory_bytes=200 * GIB)
    given = inputs_of(Settings(trainer_args='{"optim": "adamw_torch"}'), two, Q8)
    d = decide.decide(given)
    assert len(d.search) == 2
    larger, smaller = d.search
    assert larger.gradient_checkpointing and not smaller.gradient_checkpointing
    assert larger.micro_batch > smaller.micro_batch and larger.rows == smaller.rows == 4
    adopted = decide.adopt(given, d, smaller, "the fastest")
    assert adopted.split == smaller and adopted.searched and adopted.search == ()
    assert adopted.record().batch == smaller and adopted.reasons["split"] == "the fastest"
    assert decided(shape=Q8, machine=two, micro_batch=4, batch_search="false").search == ()
    # with the one-pass step (the defaults) no fp32 gradients are made: 4 rows fit without checkpointing
    d = decide.decide(inputs_of(Settings(), two, Q8))
    assert not d.split.gradient_checkpointing and d.split.rows == 4 and d.row.states_not_made > 0


def test_escalation_turns_checkpointing_on_then_moves_the_stage():
    given = inputs_of(Settings(optimizer="adamw"), ONE_H200, Q4)  # full precision (auto: test_escalation_..._8bit)
    d = decide.decide(given)
    assert d.split.text() == "4 x 1, checkpointing off" and not d.search
    on, change = escalation.escalate(given, d, "the probe ran out of GPU memory")
    assert change == "timing 4 x 1, checkpointing on against 2 x 2, checkpointing off" and on.stage.name == "2"
    assert on.split.gradient_checkpointing and on.row.peak < d.row.peak
    offloaded, change = escalation.escalate(given, on, "the probe ran out of GPU memory")
    assert change == "offloading the checkpoints to host memory" and offloaded.split.offload_activations
    assert offloaded.row.activations < on.row.activations and offloaded.row.host > on.row.host
    moved, change = escalation.escalate(given, offloaded, "the probe ran out of GPU memory")
    assert change == "moving to ZeRO 3" and moved.stage.name == "3" and moved.ds_config == stages.shipped_config("3")
    # compiled layers at ZeRO-2; at ZeRO-3, not measured compiled, Liger's kernels instead
    assert (d.compile, d.liger, moved.compile, moved.liger) == (True, False, False, True)
    assert moved.reasons["compile"].startswith("off, auto with ZeRO-3")
    last = inputs_of(Settings(zero_stage="3-offload-all", gradient_checkpointing="true"), ONE_H200, Q4)
    assert escalation.escalate(last, decide.decide(last), "x") == (None, "lower SFT_MICRO_BATCH or SFT_MAX_LENGTH")


def test_escalation_times_checkpointing_on_against_fewer_rows_a_pass_where_the_job_chose_the_split():
    """Which is faster, recomputing every activation or two passes of half the rows, no memory rule decides:
    the probe's batch search times both (the fastest is kept and recorded, so a resume keeps it)."""
    given = inputs_of(Settings(), ONE_H200, Q8)  # Qwen3-8B: 8-bit AdamW state, 4 x 1 without checkpointing
    d = decide.decide(given)
    assert (d.stage.name, d.split.text(), d.search) == ("2-8bit", "4 x 1, checkpointing off", ())
    nxt, change = escalation.escalate(given, d, "rank 0 peaked at 127.8 GiB of 139.8 GiB, less than 10% free")
    assert change == "timing 4 x 1, checkpointing on against 2 x 2, checkpointing off"
    assert nxt.split.text() == "4 x 1, checkpointing on" and [s.text() for s in nxt.search] == [
        "4 x 1, checkpointing on", "2 x 2, checkpointing off"]
    assert nxt.reasons["batch_search"].startswith("times 2 splits of 4 rows per step (rank 0 peaked at 127.8 GiB")
    adopted = decide.adopt(given, nxt, nxt.search[1], "the fastest")
    assert adopted.record().batch == nxt.search[1]
    # the user's micro-batch, a search already made or turned off: checkpointing on alone, as on CPU ranks
    for settings in (Settings(micro_batch=4), Settings(batch_search="false")):
        mine = inputs_of(settings, ONE_H200, Q8)
        assert escalation.escalate(mine, decide.decide(mine), "x")[0].search == ()
    assert escalation.escalate(given, adopted, "x")[0].search == ()


def test_a_stage_moved_to_plans_its_activations_and_split_afresh():
    """Qwen3-4B on one H100 (measured): ZeRO-2 with checkpointing on, then offloaded, each peaked over 90%; the move to
    8-bit state went on with the checkpoints in host memory (11,123 tokens/s). Its states are smaller: the
    checkpoints go back to the GPU and the batch search times them against fewer rows a pass without them. Since the
    plan counts the one-pass step beside the checkpointed backward (74.77 GiB for ZeRO-1; 74.93 measured for ZeRO-2),
    the H100's decision starts there, without the two probes at full precision."""
    h100 = Machine(gpus=(H100,), host_memory_bytes=125 * GIB, memlock_bytes=None, liger_installed=True)
    d = decide.decide(inputs_of(Settings(), h100, Q4))
    assert (d.stage.name, d.split.text()) == ("2-8bit", "4 x 1, checkpointing on")
    assert [s.text() for s in d.search] == ["4 x 1, checkpointing on", "2 x 2, checkpointing off"]
    assert "no option with full-precision AdamW state fits the GPUs" in d.reasons["stage"]
    # checkpointing off where the new stage fits without it: Qwen3-4B on one H200 (141 GiB)
    roomy = inputs_of(Settings(), ONE_H200, Q4)
    d = decide.decide(roomy)
    while not d.split.offload_activations:
        d, _ = escalation.escalate(roomy, d, "out of memory")
        d = dataclasses.replace(d, search=())  # as if the probe's search had timed none
    offloaded = d
    moved, _ = escalation.escalate(roomy, offloaded, "out of memory")
    assert (moved.stage.name, moved.split.text()) == ("2-8bit", "4 x 1, checkpointing off")
    assert moved.reasons["gradient_checkpointing"] == (
        "off, auto: planned again for ZeRO-2 8-bit AdamW after the probe (77.60 GiB predicted)")
    # the user's choice of checkpointing, or a split already searched, moves with the stage as it was
    why = "rank 0 peaked at 131.9 GiB of 140.4 GiB, less than 10% free"
    mine = inputs_of(Settings(gradient_checkpointing="offload"), ONE_H200, Q4)
    assert escalation.escalate(mine, decide.decide(mine), why)[0].split.offload_activations
    searched = dataclasses.replace(offloaded, searched=True)
    assert escalation.escalate(roomy, searched, why)[0].split.offload_activations


def test_an_explicit_stage_does_not_escalate_and_names_the_next():
    given = inputs_of(Settings(zero_stage="2", gradient_checkpointing="true", optimizer="adamw"), ONE_H200, Q4)
    assert escalation.escalate(given, decide.decide(given), "oom") == (None, "try SFT_ZERO_STAGE=3")
    given = inputs_of(Settings(zero_stage="2", gradient_checkpointing="true"), ONE_H200, Q4)
    assert escalation.escalate(given, decide.decide(given), "oom") == (None, "try SFT_ZERO_STAGE=2-8bit")


def test_escalating_into_offload_decides_pin_memory_for_it():
    machine = Machine(gpus=(H200,), host_memory_bytes=120 * GIB, memlock_bytes=64 * 1024)
    given = inputs_of(Settings(gradient_checkpointing="true"), machine, Q4)
    d = decide.decide(given)
    while not d.offload:
        d, _ = escalation.escalate(given, d, "oom")
    assert d.stage.name == "3-offload" and d.pin_memory is False
    assert d.ds_config["zero_optimization"]["offload_optimizer"]["pin_memory"] is False


def test_settings_reach_the_decision_unchanged_where_they_are_explicit():
    d = decided(precision="fp32", attention="sdpa", liger_kernels="false", launcher="deepspeed",
                gradient_checkpointing="true", micro_batch=2, grad_accum=2, batch_search="false")
    assert (d.bf16, d.attention, d.liger, d.launcher) == (False, "sdpa", False, "deepspeed")
    assert split_of(d) == (2, 2, True)
    assert d.reasons["precision"] == "fp32 (SFT_PRECISION)" and d.reasons["launcher"] == "deepspeed (SFT_LAUNCHER)"


def test_flash_attention_4_where_it_runs_and_a_clear_refusal_where_it_cannot():
    with_fa4 = dataclasses.replace(ONE_H200, flash_attention_4_installed=True)
    d = decided(machine=with_fa4, attention="flash_attention_4")
    assert (d.attention, d.compile, d.stage.name) == ("flash_attention_4", True, "2")
    assert d.reasons["attention"] == "flash_attention_4 (SFT_ATTENTION)"
    a100 = dataclasses.replace(with_fa4, gpus=(GPU("NVIDIA A100-SXM4-80GB", 80 * GIB, (8, 0)),))
    for machine, why in ((ONE_H200, "flash-attn-4 is not installed here"),
                         (a100, "NVIDIA A100-SXM4-80GB is older than compute capability 9.0"),
                         (dataclasses.replace(CPU_HOST, flash_attention_4_installed=True), "this machine has no GPU")):
        with pytest.raises(CannotRun, match="SFT_ATTENTION='flash_attention_4': " + why + "; FlashAttention-4 runs "
                           "on GPUs of compute capability 9.0 or newer"):
            decided(machine=machine, attention="flash_attention_4",
                    **({} if machine.gpus else {"shape": TINY, "max_length": 64}))
    # only the GPUs the job uses count: an old GPU beside a Hopper one, left out by SFT_GPUS
    mixed = dataclasses.replace(with_fa4, gpus=(a100.gpus[0], H200))
    assert decided(machine=mixed, attention="flash_attention_4", gpus="1").attention == "flash_attention_4"
    broken = dataclasses.replace(with_fa4, flash_attention_4_broken="ImportError: libcuda.so.1")
    with pytest.raises(CannotRun, match=r"flash-attn-4 is installed but does not import \(ImportError: libcuda"):
        decided(machine=broken, attention="flash_attention_4")
    with pytest.raises(CannotRun, match="SFT_ATTENTION=flash_attention_4: a split row needs sdpa"):
        decided(shape=Q8, machine=dataclasses.replace(EIGHT_H200, flash_attention_4_installed=True), max_length=MILLION,
                packing=False, attention="flash_attention_4")


def test_auto_attention_is_flash_attention_4_for_compiled_layers_up_to_the_rows_where_it_was_faster():
    with_fa4 = dataclasses.replace(ONE_H200, flash_attention_4_installed=True)
    d = decided(machine=with_fa4)
    assert (d.attention, d.compile, d.stage.name) == ("flash_attention_4", True, "2")
    assert d.reasons["attention"].startswith("flash_attention_4, auto: compiled layers")
    assert decided(machine=with_fa4, max_length=8192).attention == "flash_attention_4"
    ada = dataclasses.replace(with_fa4, gpus=(dataclasses.replace(H200, capability=(8, 9)),))  # fits compiled
    broken = dataclasses.replace(with_fa4, flash_attention_4_broken="ImportError: libcuda.so.1")
    for kwargs, why in ((dict(machine=ONE_H200), "flash-attn-4 is not installed here"),
                        (dict(machine=with_fa4, compile="false"), "the layers are not compiled"),
                        (dict(machine=with_fa4, zero_stage="3"), "the layers are not compiled"),
                        (dict(machine=ada), "NVIDIA H200 is older than compute capability 9.0"),
                        (dict(machine=broken),
                         "flash-attn-4 is installed but does not import (ImportError: libcuda.so.1)"),
                        (dict(machine=with_fa4, max_length=16384), "rows of 16,384 tokens, longer than the 8,192")):
        d = decided(**kwargs)
        assert d.attention == "flex_attention", kwargs
        assert f"(not FlashAttention-4: {why}" in d.reasons["attention"], (kwargs, d.reasons["attention"])
    # after running out of memory, the next stage (not compiled) takes flex attention with it: decided per stage
    inputs = inputs_of(Settings(gradient_checkpointing="false", optimizer="adamw"), with_fa4, Q4)
    d = decide.decide(inputs)
    assert (d.attention, d.stage.name) == ("flash_attention_4", "2")
    after, change = escalation.escalate(inputs, d, "out of memory")
    assert after is not None and not after.compile and after.attention == "flex_attention", (change, after.stage)


def test_auto_attention_takes_the_next_kernel_the_models_class_runs_and_an_explicit_one_it_lacks_is_refused():
    """transformers refuses, in every rank as it loads the model, a kernel the class's _supports_* flags lack (Gemma2
    has no sdpa, GPT-2 no flex attention): auto takes the next one it runs, an explicit one is refused at once."""
    no_flex = dataclasses.replace(Q4, attentions=("flash_attention_4", "sdpa", "eager"), model_class="GPT2LMHeadModel")
    no_sdpa = dataclasses.replace(Q4, attentions=("flash_attention_4", "flex_attention", "eager"),
                                  model_class="Gemma2ForCausalLM")
    d = decided(shape=no_flex)  # flex on a GPU without flash-attn-4: the next is sdpa
    assert d.attention == "sdpa"
    assert d.reasons["attention"].startswith("sdpa, auto: GPT2LMHeadModel has no flex_attention in transformers "
                                             "(first: flex_attention, auto on GPUs")
    assert decided(shape=no_sdpa).attention == "flex_attention"  # it runs what auto prefers on a GPU
    tiny_no_sdpa = dataclasses.replace(TINY, attentions=no_sdpa.attentions, model_class="Gemma2ForCausalLM")
    on_cpu = decided(shape=tiny_no_sdpa, machine=CPU_HOST, max_length=64)
    assert on_cpu.attention == "eager"  # flex has no fast CPU kernel: never a CPU fallback
    assert "Gemma2ForCausalLM has no sdpa" in on_cpu.reasons["attention"]
    with pytest.raises(CannotRun) as e:
        decided(shape=no_flex, attention="flex_attention")
    assert e.value.exit_code == exitcodes.BAD_SETTINGS
    assert str(e.value) == ("SFT_ATTENTION='flex_attention': GPT2LMHeadModel (SFT_MODEL) has no flex_attention in "
                            "transformers; it runs flash_attention_4, sdpa, eager: use one of those, or auto")
    assert decided(shape=Q4, attention="flex_attention").attention == "flex_attention"  # a shape built by hand


def test_the_tokens_per_step_stay_when_the_rows_grow_longer():
    assert split_of(decided(max_length=1024, batch_search="false")) == (8, 1, False)  # 8,192 tokens a step
    assert decided(max_length=2048).split.rows == 4
    long = decided(max_length=65536)
    assert long.split.rows == 1 and "65,536 tokens per GPU per step (SFT_TOKENS_PER_STEP)" in long.reasons["split"]
    assert decided(tokens_per_step=16384, batch_search="false").split.rows == 8
    assert split_of(decided(micro_batch=2)) == (2, 1, False)  # set by hand: kept, accumulation 1
    assert split_of(decided(grad_accum=2, batch_search="false")) == (2, 2, False)  # 4 rows over 2 micro-batches


def test_long_rows_fit_by_checkpointing_then_by_offloading_the_checkpoints():
    at_128k = decided(max_length=131072)
    assert (at_128k.stage.name, split_of(at_128k), at_128k.split.offload_activations) == ("2", (1, 1, True), False)
    at_256k = decided(max_length=262144)
    assert at_256k.stage.name == "2" and at_256k.split.offload_activations
    assert at_256k.reasons["gradient_checkpointing"].startswith("offload, auto: ZeRO-2 fits only with its checkpoints")
    assert at_256k.row.host > at_128k.row.host  # the checkpoints now live in host memory, checked against it
    # the longest row each way of keeping the checkpoints allows, from the same terms as the peak
    assert 131072 <= at_128k.row.longest_row < 262144 <= at_256k.row.longest_row
    kept_on_gpu = decided(max_length=262144, gradient_checkpointing="true")  # no offloading: a stage that holds less
    assert kept_on_gpu.stage.name == "3-offload" and kept_on_gpu.row.fits and not kept_on_gpu.split.offload_activations


def test_a_cpu_host_never_offloads_checkpoints():
    d = decided(shape=TINY, machine=CPU_HOST, gradient_checkpointing="offload")
    assert d.split.gradient_checkpointing and not d.split.offload_activations


# --- rows split over the GPUs of a node (SFT_SEQUENCE_PARALLEL, DeepSpeed's Ulysses)

EIGHT_H200 = Machine(gpus=(H200,) * 8, host_memory_bytes=2000 * GIB, liger_installed=True)
MILLION = 1_048_576


def test_rows_split_over_the_gpus_asked():
    d = decided(shape=Q8, machine=EIGHT_H200, sequence_parallel=2, packing=False, max_length=262144)
    assert (d.sequence_parallel, d.attention, d.compile) == (2, "sdpa", False)
    assert d.reasons["sequence_parallel"] == ("2 (SFT_SEQUENCE_PARALLEL): each GPU holds 1/2 of each row, "
                                              "4 data-parallel group(s)")
    assert d.reasons["attention"].startswith("sdpa, auto with rows split over GPUs")
    assert d.reasons["compile"].startswith("off, auto with rows split over GPUs")
    assert d.liger  # the layers uncompiled, Liger's kernels are on
    assert "262,144 tokens per group of 2 GPUs per step" in d.reasons["split"]
    assert d.plan.setup.row_tokens == 131072 and d.row == d.plan.row(d.stage.name)
    assert d.record().sequence_parallel == 2 and d.resolved()["sequence_parallel"] == 2
    assert decided(shape=Q8, machine=EIGHT_H200).sequence_parallel == 1  # the defaults pack: never split


def test_auto_splits_a_row_over_the_fewest_gpus_that_hold_it():
    one = decided(shape=Q8, machine=EIGHT_H200, packing=False, max_length=131072)
    assert one.sequence_parallel == 1
    assert one.reasons["sequence_parallel"] == "1, auto: a row of 131,072 tokens fits on one GPU"
    d = decided(shape=Q8, machine=EIGHT_H200, packing=False, max_length=MILLION)
    n = d.sequence_parallel
    assert n > 1 and d.row.fits and d.reasons["sequence_parallel"].startswith(
        f"{n}, auto: one GPU cannot hold a row of 1,048,576 tokens; split over {n}, each holds {MILLION // n:,}")
    for fewer in (1, *(m for m in (2, 4) if m < n)):  # nothing fits on fewer GPUs a row
        with pytest.raises(CannotRun):
            decided(shape=Q8, machine=EIGHT_H200, packing=False, max_length=MILLION, sequence_parallel=fewer)


def test_auto_does_not_split_where_it_cannot_keep_the_rows_meaning():
    assert decided().reasons["sequence_parallel"] == "1, auto: one GPU per node"
    cpu = decided(shape=TINY, machine=CPU_HOST, packing=False, max_length=64)
    assert cpu.sequence_parallel == 1 and "on CPU: CPU ranks split rows only when SFT_SEQUENCE_PARALLEL asks" in (
        cpu.reasons["sequence_parallel"])
    with pytest.raises(CannotRun) as e:  # packed rows: a split would let conversations attend to each other
        decided(shape=Q8, machine=EIGHT_H200, max_length=MILLION)
    assert e.value.exit_code == exitcodes.PREFLIGHT and str(e.value).startswith("no ZeRO option fits this machine")
    assert "(rows split over GPUs: 1, auto: SFT_PACKING=true: a split row needs SFT_PACKING=false)" in str(e.value)
    with pytest.raises(CannotRun, match="SFT_ATTENTION=flex_attention: a split row needs sdpa"):
        decided(shape=Q8, machine=EIGHT_H200, max_length=MILLION, packing=False, attention="flex_attention")


@pytest.mark.parametrize("n,machine,shape,message", [
    (3, EIGHT_H200, Q8, "SFT_SEQUENCE_PARALLEL='3': 3 does not divide the 8 rank(s) of a node (each row's GPUs are "
                        "on one node); the model's 32 attention heads (8 key/value) do not split over 3 GPUs "
                        "(splits that fit here: 2, 4, 8)"),
    (16, EIGHT_H200, Q8, "16 does not divide the 8 rank(s) of a node"),
    (4, CPU_HOST, TINY, "SFT_SEQUENCE_PARALLEL='4': 4 does not divide the 2 rank(s) of a node"),
    # gloo: a row's ranks must be all of them (torch's differentiable all_gather, backward)
    (2, CPU_HOST, TINY, "SFT_SEQUENCE_PARALLEL='2': CPU ranks (gloo) split rows only over all of them: set it to "
                        "SFT_CPU_RANKS=4"),
])
def test_a_split_the_node_or_the_model_cannot_take(n, machine, shape, message):
    with pytest.raises(CannotRun) as e:
        decided(shape=shape, machine=machine, sequence_parallel=n, packing=False, max_length=96,
                cpu_ranks=4 if n == 2 else 2)
    assert e.value.exit_code == exitcodes.BAD_SETTINGS and message in str(e.value)


def test_a_split_asks_for_unpacked_rows_sdpa_and_a_length_it_divides():
    with pytest.raises(CannotRun) as e:
        decided(shape=TINY, machine=CPU_HOST, sequence_parallel=2, attention="eager", max_length=63)
    assert e.value.exit_code == exitcodes.BAD_SETTINGS
    assert str(e.value).split("; ") == [
        "SFT_SEQUENCE_PARALLEL='2': needs SFT_PACKING=false: Ulysses attention over sdpa drops the mask that keeps "
        "packed conversations apart, so they would attend to each other",
        "SFT_SEQUENCE_PARALLEL='2': needs SFT_ATTENTION=auto or sdpa: DeepSpeed's Ulysses wraps sdpa, not eager",
        "SFT_SEQUENCE_PARALLEL='2': needs an SFT_MAX_LENGTH that 2 divides: each GPU holds an equal share of a row"]
    d = decided(shape=TINY, machine=CPU_HOST, sequence_parallel=2, packing=False, max_length=64)
    assert (d.sequence_parallel, d.attention, d.ranks.count) == (2, "sdpa", 2)


def test_a_resume_keeps_the_checkpoints_split_and_refuses_another():
    record = CheckpointRecord("2", 8, sequence_parallel=2)
    d = decided(shape=Q8, machine=EIGHT_H200, record=record, packing=False)
    assert d.sequence_parallel == 2 and d.reasons["sequence_parallel"] == "2, as the checkpoint resumed was written"
    same = decided(shape=Q8, machine=EIGHT_H200, record=record, packing=False, sequence_parallel=2)
    assert same.sequence_parallel == 2
    with pytest.raises(CannotRun) as e:
        decided(shape=Q8, machine=EIGHT_H200, record=record, packing=False, sequence_parallel=4)
    assert e.value.exit_code == exitcodes.PREFLIGHT
    assert str(e.value).startswith("SFT_SEQUENCE_PARALLEL='4': the checkpoint to resume split each row over 2 ranks")
    assert decided(shape=Q8, machine=EIGHT_H200, record=CheckpointRecord("2", 8)).sequence_parallel == 1  # older


def test_a_split_row_divides_what_grows_with_its_tokens_not_the_model_states():
    split = decided(shape=Q8, machine=EIGHT_H200, sequence_parallel=2, packing=False, max_length=262144,
                    zero_stage="2", gradient_checkpointing="true")
    half = decided(shape=Q8, machine=EIGHT_H200, packing=False, max_length=131072, zero_stage="2",
                   gradient_checkpointing="true", sequence_parallel=1)
    whole = decided(shape=Q8, machine=EIGHT_H200, packing=False, max_length=262144, zero_stage="2",
                    gradient_checkpointing="true", sequence_parallel=1)
    assert (split.row.activations, split.row.logits) == (half.row.activations, half.row.logits)
    # the LM head's tiles kept for the backward take what memory is left (the split row has room, the whole none)
    assert split.row.activations < whole.row.activations
    assert split.row.logits - split.row.head_kept < whole.row.logits - whole.row.head_kept
    assert (split.row.model_states, split.row.buckets, split.row.optimizer_step) == (
        whole.row.model_states, whole.row.buckets, whole.row.optimizer_step)
    # the longest row: one GPU holds 1/2 of it, so it doubles (to the search's 1,024-token steps)
    assert abs(split.row.longest_row - 2 * whole.row.longest_row) <= 2 * 1024


# --- the output folder's disk (planner/disk.py)

PER_PARAM = [
    # precision, ZeRO, optimizer -> bytes/param (fp32 ZeRO-2 and ZeRO-3 as measured on the demo model)
    (False, 2, "adamw_torch", 20),  # fp32 weights twice (module states + model.safetensors), master 4, moments 8
    (False, 3, "adamw_torch", 16),  # ZeRO-3 saves the gathered weights once
    (True, 2, "adamw_torch_fused", 16),
    (True, 3, "AdamW", 14),  # the seed's 115 GB checkpoint of Qwen3-8B: 14 x 8.19e9
    (True, 1, "adamw_bnb_8bit", 10),  # two 1-byte moments
    (True, 3, "sgd", 10),
    (True, 3, "adafactor", 6),
    (True, 3, "ademamix", 18),
    (True, 3, "something_new", 14),  # unknown: taken as Adam-like
]


@pytest.mark.parametrize("bf16,zero,optimizer,per_param", PER_PARAM)
def test_a_checkpoints_bytes_per_param(bf16, zero, optimizer, per_param):
    got, why = disk.checkpoint_bytes_per_param(bf16, zero, optimizer)
    assert got == per_param and why.startswith(f"{per_param} bytes/param: ")
    assert ("taken as Adam-like" in why) == (optimizer == "something_new")


def test_the_optimizer_is_the_deepspeed_files_then_the_trainer_arguments():
    assert disk.optimizer_of({}, {}) == "adamw_torch"
    assert disk.optimizer_of({}, {"optim": "adafactor"}) == "adafactor"
    assert disk.optimizer_of({"optimizer": {"type": "Lion"}}, {"optim": "adafactor"}) == "Lion"


def test_the_preflight_sizes_the_checkpoint_from_the_decision():
    from sft.controller import preflight

    fp32 = preflight.Needs.of(decided(shape=TINY, machine=CPU_HOST), TINY.total_params, 2, end_saves=True)
    assert (fp32.checkpoint_bytes_per_param, fp32.final_bytes_per_param) == (20, 4)  # CPU: fp32, ZeRO-2
    bf16 = preflight.Needs.of(decided(zero_stage="3"), Q4.total_params, 2, {"optim": "adamw_8bit"}, end_saves=True)
    assert (bf16.checkpoint_bytes_per_param, bf16.final_bytes_per_param) == (8, 2)
    assert "optimizer state (adamw_8bit: 2 state(s) of 1 byte(s): 2)" in bf16.checkpoint_why
    assert fp32.final_linked and bf16.final_linked  # final/: links to the last checkpoint's model files
    best = preflight.Needs.of(decided(), Q4.total_params, 2, {"load_best_model_at_end": True}, end_saves=True)
    assert not best.final_linked  # the best checkpoint's weights, loaded at the end, are written again
    by_time = preflight.Needs.of(decided(), Q4.total_params, 2, end_saves=disk.end_checkpoint(by_steps=False))
    assert not by_time.final_linked  # by time the end saves no checkpoint: final/ is written, and counted
    ok = preflight.check_disk(int(3.1 * 16 * Q4.total_params), "/out", Q4.total_params, 2, 16, 0)
    assert ok.status == "ok" and "and final/ (links to the last checkpoint's model files)" in ok.message
    assert preflight.check_disk(int(3.1 * 16 * Q4.total_params), "/out", Q4.total_params, 2, 16, 2).status == "fail"


SAVES_LEFT = [(20, 64, 20, 3), (40, 64, 20, 2), (60, 64, 20, 1), (64, 64, 20, 0), (20, 60, 20, 2), (0, 10, 5, 2)]


@pytest.mark.parametrize("step,max_steps,save_steps,left", SAVES_LEFT)
def test_saves_left_count_the_one_at_the_last_step(step, max_steps, save_steps, left):
    assert disk.saves_left(step, max_steps, save_steps) == left
    # by time the end saves none: one fewer, and none where only the last step was left
    assert disk.saves_left(step, max_steps, save_steps, at_end=False) == max(left - 1, 0)


def test_room_after_a_save_counts_the_checkpoints_still_to_come():
    gb = 10**9
    # two kept, two saves to come, limit 2: one more at once (written before the oldest goes), then final/
    fits, why = disk.room_after_save(2 * gb, 3 * gb, kept=2, save_total_limit=2, left=2, final_bytes=gb // 2)
    assert fits and why.endswith("the rest of the run needs 2.5 GB (1 more checkpoint(s) at once and the 0.5 GB "
                                 "final model)")
    short, why = disk.room_after_save(2 * gb, 2 * gb, kept=2, save_total_limit=2, left=2, final_bytes=gb // 2)
    assert not short and "the disk would fill before the run ends, so it stops now" in why
    # the first save of three, limit 2: two more at once
    assert not disk.room_after_save(2 * gb, 5 * gb, kept=1, save_total_limit=2, left=3, final_bytes=3 * gb // 2)[0]
    assert disk.room_after_save(2 * gb, 5 * gb, kept=1, save_total_limit=2, left=3, final_bytes=gb // 2)[0]
    # final/ as links to the last checkpoint's files: no room of its own
    fits, why = disk.room_after_save(2 * gb, 2 * gb, kept=2, save_total_limit=2, left=2, final_bytes=0)
    assert fits and why.endswith("needs 2 GB (1 more checkpoint(s) at once and final/ as links to the last one's files)")
    # the last save: only final/ is to come
    assert disk.room_after_save(2 * gb, gb, kept=2, save_total_limit=2, left=0, final_bytes=gb // 2)[0]
    assert disk.full_after_failure(10**6, 2 * gb) and not disk.full_after_failure(3 * gb, 2 * gb)
    assert not disk.full_after_failure(0, None)  # no checkpoint to compare with


# --- a finished run started again (planner/restart.py)


def test_a_finished_run_started_again_names_what_differs():
    defaults = Settings().to_dict()
    before = Settings(learning_rate=1e-5).to_dict()
    same, message = restart.verdict(before, Settings(probe_steps=0, gpus="0,1").to_dict(), defaults, "/out")
    assert same and message == "/out is already trained with these settings; nothing to do."
    same, message = restart.verdict(before, Settings(learning_rate=2e-5, epochs=2.0).to_dict(), defaults, "/out")
    assert not same
    assert message.startswith("/out holds a finished run with other settings: SFT_EPOCHS=2.0 (the finished run: "
                              "1.0); SFT_LEARNING_RATE=2e-05 (the finished run: 1e-05). Nothing was started")
    assert "start a new run with another SFT_OUTPUT_DIR" in message
    # a setting the finished run's record lacks (a newer job's) counts as its default
    older = {k: v for k, v in before.items() if k != "attention"}
    assert restart.verdict(older, Settings().to_dict(), defaults, "/out")[0]
    assert not restart.verdict(older, Settings(attention="eager").to_dict(), defaults, "/out")[0]


def test_the_budget_caps_the_steps_and_a_resume_keeps_the_cap():
    d = decided()
    assert d.max_steps is None and d.record().max_steps is None  # SFT_MAX_STEPS and SFT_EPOCHS govern
    capped = decide.cap_steps(d, 480, "the steps that fit the budget (SFT_BUDGET_ACTION=truncate)")
    assert capped.max_steps == 480 and capped.reasons["max_steps"].startswith("480 steps, the steps that fit")
    record = CheckpointRecord.from_dict(capped.record().to_dict())  # as a checkpoint holds it
    resumed = decided(record=record)
    assert resumed.max_steps == 480 and "as the budget capped them for the checkpoint resumed" in \
        resumed.reasons["max_steps"]


# -- the data: which tokens carry the loss, the evaluation (planner/data.py) ---------------------------

MESSAGES = DataFacts("conversational language modeling", True, False, (DataSource("chat.jsonl"),), rows=512)
CONV_PC = DataFacts("conversational prompt-completion", True, True, (DataSource("pc.parquet"),), rows=512)
STANDARD_PC = DataFacts("standard prompt-completion", False, True, (DataSource("pc.csv"),), rows=512)
TEXT = DataFacts("standard language modeling", False, False, (DataSource("org/text", revision="a" * 40),), rows=512)


@pytest.mark.parametrize("asked,facts,mode,why", [
    ("auto", MESSAGES, "all", "all tokens, auto: conversational language modeling data learns every token"),
    ("auto", TEXT, "all", "all tokens, auto: standard language modeling data learns every token"),
    ("auto", CONV_PC, "completion", "completion, auto: prompt/completion data learns its completions"),
    ("auto", STANDARD_PC, "completion", "completion, auto: prompt/completion data learns its completions"),
    ("all", STANDARD_PC, "all", "all tokens (SFT_LOSS_ON)"),
    ("completion", CONV_PC, "completion", "completion (SFT_LOSS_ON)"),
    ("assistant", dataclasses.replace(MESSAGES, marks_assistant=True), "assistant", "assistant turns only"),
    ("assistant", dataclasses.replace(CONV_PC, marks_assistant=True), "assistant", "assistant turns only"),
])
def test_which_tokens_carry_the_loss(asked, facts, mode, why):
    assert data_rules.loss_mode(asked, facts)[0] == mode
    assert data_rules.loss_mode(asked, facts)[1].startswith(why)


@pytest.mark.parametrize("asked,facts,message", [
    ("assistant", TEXT, "SFT_LOSS_ON=assistant needs conversations, and this data is standard language modeling"),
    ("assistant", dataclasses.replace(MESSAGES, marks_assistant=False),
     "the model's chat template cannot mark the assistant's tokens"),
    ("completion", MESSAGES, "SFT_LOSS_ON=completion needs prompt/completion data, and this data is conversational"),
    ("completion", TEXT, "SFT_LOSS_ON=completion needs prompt/completion data"),
])
def test_a_loss_the_data_cannot_have_is_a_settings_error(asked, facts, message):
    with pytest.raises(CannotRun) as e:
        data_rules.loss_mode(asked, facts)
    assert e.value.exit_code == exitcodes.BAD_SETTINGS and message in str(e.value)
    if "chat template" in message:
        assert "set SFT_CHAT_TEMPLATE" in str(e.value)  # the fix is named


def test_evaluation_comes_from_one_place_with_its_reason():
    train = list(TEXT.train)
    assert data_rules.evaluation(Settings(), train) == (
        [], 0.0, "none (SFT_EVAL_DATASET, SFT_EVAL_SPLIT and SFT_EVAL_FRACTION unset)")
    sources, fraction, why = data_rules.evaluation(Settings(eval_fraction=0.1, seed=7), train)
    assert (sources, fraction) == ([], 0.1) and "seed 7: the same rows on every start" in why
    sources, fraction, why = data_rules.evaluation(Settings(eval_split="test"), train)
    assert sources == [DataSource("org/text", "test", revision="a" * 40)] and fraction == 0.0
    assert why == "the 'test' split of SFT_DATASET (SFT_EVAL_SPLIT), every row"
    sources, _, why = data_rules.evaluation(Settings(eval_dataset="held.jsonl:100, org/ev:0.5"), train)
    assert sources == [DataSource("held.jsonl", rows=100), DataSource("org/ev", weight=0.5)]
    assert why == "SFT_EVAL_DATASET, split 'train'"


def test_evaluation_runs_with_each_checkpoint_unless_told_and_at_the_end():
    assert data_rules.eval_every(Settings(save_steps=200), True) == (
        200, "every 200 steps, with each checkpoint (SFT_SAVE_STEPS), and at the end")
    every = (25, "every 25 steps (SFT_EVAL_STEPS) and at the end")
    assert data_rules.eval_every(Settings(eval_steps=25), True) == every
    assert data_rules.eval_every(Settings(eval_steps=25), False) == (None, "")


def test_the_decision_carries_the_data_plan_and_the_models_commit():
    given = inputs_of(Settings(eval_fraction=0.05, eval_steps=10, model_revision="v1"), ONE_H200, Q4,
                   data=CONV_PC, model_revision="b" * 40)
    d = decide.decide(given)
    assert d.data == DataPlan(train=[DataSource("pc.parquet")], eval_fraction=0.05, eval_steps=10,
                              loss_on="completion", seed=42)
    assert d.reasons["loss"].startswith("completion, auto") and d.reasons["evaluation"].endswith("and at the end")
    assert d.reasons["model"] == f"Qwen/Qwen3-8B at commit {'b' * 40} (SFT_MODEL_REVISION=v1)"
    assert d.resolved()["loss_on"] == "completion" and d.resolved()["model_revision"] == "b" * 40
    assert decided().data is None and "loss" not in decided().reasons  # `plan` decides without the data


def test_a_split_checkpoint_on_another_number_of_gpus_is_converted_keeping_its_split_and_its_cap():
    """Main's resharding with rows split over GPUs: the checkpoint's SFT_SEQUENCE_PARALLEL stays, and the rows of
    a step are its data-parallel groups' (world / N), which the new groups share."""
    record = CheckpointRecord("2", 8, max_steps=50, sequence_parallel=2)  # 4 groups x 4 x 1: 16 rows per step
    d = decided(shape=Q8, machine=FOUR_H200, record=record, packing=False)
    assert (d.sequence_parallel, d.reshard.from_world, d.reshard.to_world) == (2, 8, 4)
    assert split_of(d)[:2] == (4, 2) and d.reshard.rows == 16 == d.ranks.world // 2 * d.split.rows
    assert d.reasons["split"] == "4 x 2 on each of 2 data-parallel groups of 2 ranks: the checkpoint's 16 rows per step"
    assert d.ds_config["checkpoint"] == {"load_universal": True} and d.max_steps == 50
    written = d.record()  # a later resume keeps the split, the cap and the groups' split of the rows
    assert (written.world_size, written.sequence_parallel, written.max_steps, written.batch) == (4, 2, 50, d.split)
    with pytest.raises(CannotRun, match=r"SFT_SEQUENCE_PARALLEL='2': 2 does not divide the 3 rank\(s\) of a node"):
        decided(shape=Q8, machine=Machine(gpus=(H200,) * 3, host_memory_bytes=400 * GIB), record=record,
                packing=False)


def test_auto_compiles_the_layers_on_gpus_with_zero_1_and_2_and_then_without_liger():
    """On H200s (2026-12-02): each decoder layer compiled, Liger's kernels off, trained 12-18% faster than
    uncompiled with them, the same loss and peak; compiled with Liger's kernels the loss was NaN (2026-12-01).
    Not measured compiled: ZeRO-3 and its offload, rows split over GPUs; CPU ranks never compile by auto."""
    d = decided()
    assert (d.compile, d.liger) == (True, False) and d.reasons["compile"].startswith("on, auto on GPUs with ZeRO-1")
    assert d.reasons["liger"].startswith("off, auto: the model's layers are compiled")
    # the planner counts a compiled layer's activations as Liger's: the same plan as uncompiled with Liger
    uncompiled = decided(compile="false")
    assert (uncompiled.compile, uncompiled.liger) == (False, True)
    assert uncompiled.reasons["compile"] == "false (SFT_COMPILE)"
    assert d.row.peak == uncompiled.row.peak and split_of(d) == split_of(uncompiled) == (4, 1, False)
    assert d.plan.setup.liger_kernels and d.resolved()["compile"] is True
    for stage in ("3", "3-offload"):
        z3 = decided(zero_stage=stage)
        assert (z3.compile, z3.liger) == (False, True), stage
        assert z3.reasons["compile"].startswith(f"off, auto with ZeRO-{stage}: measured compiled only with ZeRO-1")
    assert decided(zero_stage="1").compile is True
    cpu = decided(machine=CPU_HOST, shape=TINY)
    assert (cpu.compile, cpu.liger) == (False, False) and cpu.reasons["compile"].startswith("off, auto on CPU")
    asked = decided(compile="true", zero_stage="3")
    assert asked.compile is True and asked.reasons["compile"] == "true (SFT_COMPILE)" and asked.liger is False
    assert decided(compile="false", liger_kernels="false").liger is False
    liger = decided(liger_kernels="true")  # Liger's kernels asked for: auto does not compile them
    assert (liger.compile, liger.liger) == (False, True)
    assert liger.reasons["compile"] == ("off, auto: SFT_LIGER_KERNELS=true, and compiled with Liger's kernels "
                                        "the loss was NaN")


def test_auto_leaves_the_layers_uncompiled_where_memory_moves_it_to_zero_3():
    """A stage auto picks because ZeRO-1 and 2 do not fit is decided with its own compile and Liger."""
    roomy = Machine(gpus=(H200,), host_memory_bytes=400 * GIB, memlock_bytes=None, liger_installed=True)
    d = decided(shape=Q8, machine=roomy, optimizer="adamw")  # full precision: 8-bit ZeRO-2 would fit
    assert (d.stage.name, d.compile, d.liger) == ("3-offload", False, True)
    assert d.reasons["compile"].startswith("off, auto with ZeRO-3-offload")
    assert d.reasons["liger"].startswith("on, auto on GPUs")
    two = decided(shape=Q8, machine=dataclasses.replace(roomy, gpus=(H200,) * 2))
    assert (two.stage.name, two.compile, two.liger) == ("2", True, False)


def test_checkpoints_by_time_are_as_many_steps_apart_as_fill_the_interval():
    assert disk.steps_between_saves(200, None, 0.47) == 200  # SFT_SAVE_STEPS
    assert disk.steps_between_saves(None, 1800.0, 0.4705) == 3826  # rounded up: the interval is the least between
    assert disk.steps_between_saves(None, 1.0, 5.0) == 1  # a step longer than the interval: each step
    assert disk.steps_between_saves(None, 1800.0, None) == 1  # speed unknown: the most checkpoints there can be


def test_qwen3_8b_on_one_h200_takes_8bit_adamw_state_where_no_full_precision_option_fits():
    """The seed's model on the GPU most people rent: no option with full-precision AdamW state fits its GPU, and
    offloaded each step waits for the host; auto takes ZeRO-2 with 8-bit AdamW state, and says so. Forced to full
    precision the job is told plainly that it does not fit, and what would."""
    h200 = Machine(gpus=(H200,), host_memory_bytes=125 * GIB, memlock_bytes=None, liger_installed=True)
    d = decided(shape=Q8, machine=h200)
    assert (d.stage.name, d.stage.optimizer) == ("2-8bit", "adamw_bnb_8bit")
    assert d.reasons["stage"].startswith("auto: ZeRO-2 8-bit AdamW, the lowest option that fits: ")
    assert "no option with full-precision AdamW state fits the GPUs" in d.reasons["stage"]
    assert d.reasons["optimizer"].startswith("8-bit AdamW (adamw_bnb_8bit: bitsandbytes")
    assert d.row.states_not_made > 0  # the one-pass step makes no fp32 gradient partition
    assert d.plan.row("2-8bit").model_states < d.plan.row("2").model_states
    with pytest.raises(CannotRun) as refused:
        decided(shape=Q8, machine=h200, optimizer="adamw")
    assert refused.value.exit_code == exitcodes.PREFLIGHT
    assert "no ZeRO option fits this machine" in str(refused.value)
    assert "ZeRO-2 8-bit AdamW fits" in str(refused.value) and "SFT_OPTIMIZER=auto runs it" in str(refused.value)
    assert "8-bit AdamW:" not in str(refused.value).split("(SFT_OPTIMIZER=adamw")[0]  # only the options allowed
    forced = decided(shape=Q8, machine=h200, optimizer="adamw-8bit", zero_stage="3")
    assert forced.stage.name == "3-8bit" and forced.reasons["stage"] == "ZeRO-3 8-bit AdamW (SFT_ZERO_STAGE)"


def test_where_full_precision_fits_auto_keeps_it_and_an_optimizer_of_the_users_is_never_swapped():
    d = decided()  # Qwen3-4B on one H200
    assert d.stage.name == "2" and not d.stage.optimizer
    assert d.reasons["optimizer"].startswith("AdamW, full precision: torch's fused AdamW")
    smaller = Machine(gpus=(GPU("a GPU of 64 GiB", 64 * GIB),), host_memory_bytes=125 * GIB, memlock_bytes=None,
                      liger_installed=True)
    assert decided(machine=smaller).stage.name == "2-8bit"  # full precision fits no option on the GPU
    theirs = decided(machine=smaller, trainer_args='{"optim": "adamw_torch"}')
    assert theirs.stage.name == "3-offload" and theirs.reasons["optimizer"].startswith("AdamW, full precision: DeepS")
    assert decided(trainer_args='{"optim": "adamw_torch"}').reasons["optimizer"] == "adamw_torch, as SFT_TRAINER_ARGS says"
    two = decided(machine=dataclasses.replace(smaller, gpus=smaller.gpus * 2))
    assert two.stage.name == "2"  # two GPUs: ZeRO-2 shards the state, full precision fits


def test_escalation_after_running_out_of_memory_moves_to_8bit_state_on_one_gpu():
    inputs = inputs_of(Settings(gradient_checkpointing="true"), ONE_H200, Q4)
    d = decide.decide(inputs)
    assert d.stage.name == "2"
    nxt, change = escalation.escalate(inputs, d, "out of memory")
    assert nxt.stage.name == "2-8bit" and change == "moving to ZeRO 2-8bit"
    kept = inputs_of(Settings(gradient_checkpointing="true", optimizer="adamw"), ONE_H200, Q4)
    assert escalation.escalate(kept, decide.decide(kept), "out of memory")[0].stage.name == "3"
