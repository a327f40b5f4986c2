"""The table of ZeRO options: every shipped DeepSpeed config loads, matches the seed's, and DeepSpeed's own
schema accepts it."""

from __future__ import annotations

import copy
import json

import pytest

from sft import stages

# The seed guide's configs, verbatim (ds_zero2.json, ds_zero3.json, ds_zero3_offload.json).
SEED_TAIL = {"gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
             "gradient_accumulation_steps": "auto"}
SEED_ZERO2 = {"bf16": {"enabled": "auto"}, "zero_optimization": {
    "stage": 2, "overlap_comm": True, "allgather_bucket_size": 2e8, "reduce_bucket_size": 2e8,
    "contiguous_gradients": True}, **SEED_TAIL}
SEED_ZERO3 = {"bf16": {"enabled": "auto"}, "zero_optimization": {
    "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_gather_16bit_weights_on_model_save": True}, **SEED_TAIL}
SEED_OFFLOAD = copy.deepcopy(SEED_ZERO3)
SEED_OFFLOAD["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                         "weight_decay": "auto"}}
SEED_OFFLOAD["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}


def _seed(stage: str) -> dict:
    """The seed's config for each option; ZeRO-1 and offload-all as the seed says to derive them; an option with 8-bit
    AdamW state is its stage's config (the optimizer is the Trainer's)."""
    stage = stage.removesuffix("-8bit")
    if stage == "1":
        config = copy.deepcopy(SEED_ZERO2)
        config["zero_optimization"]["stage"] = 1  # "take ds_zero2.json and change the stage to 1"
        return config
    if stage == "3-offload-all":
        config = copy.deepcopy(SEED_OFFLOAD)  # "add offload_param next to offload_optimizer"
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
        return config
    return {"2": SEED_ZERO2, "3": SEED_ZERO3, "3-offload": SEED_OFFLOAD}[stage]


@pytest.mark.parametrize("stage", stages.NAMES)
def test_shipped_config_is_the_seeds(stage):
    """The seed's, plus the job's two changes: bf16's overflow check and DeepSpeed's throughput timer off (the
    file on disk is the seed's)."""
    expected = _seed(stage)
    assert json.loads((stages.CONFIG_DIR / stages.get(stage).config_file).read_text()) == expected
    expected = copy.deepcopy(expected)
    expected["bf16"]["check_grad_overflow"] = False
    expected["timers"] = {"throughput": {"enabled": False}}
    assert stages.shipped_config(stage) == expected
    optimizer = "adamw-8bit" if stages.get(stage).eight_bit else "auto"
    assert stages.of_config(stages.shipped_config(stage), optimizer) == stages.get(stage)


@pytest.mark.parametrize("stage", stages.NAMES)
def test_deepspeed_reads_the_overflow_check_as_off(stage):
    from deepspeed.runtime.precision_config import get_bfloat16_config

    assert get_bfloat16_config({"bf16": {**stages.shipped_config(stage)["bf16"], "enabled": True}}
                               ).check_grad_overflow is False


@pytest.mark.parametrize("stage", stages.NAMES)
def test_deepspeed_reads_the_throughput_timer_as_off(stage):
    from deepspeed.utils.config import get_timers_config

    assert get_timers_config(stages.shipped_config(stage)).enabled is False


@pytest.mark.parametrize("stage", stages.NAMES)
def test_deepspeed_schema_accepts_it(stage):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = {k: v for k, v in stages.shipped_config(stage)["zero_optimization"].items() if v != "auto"}
    parsed = DeepSpeedZeroConfig(**zero)
    assert int(parsed.stage) == int(stage[0])


def test_every_file_in_ds_configs_is_shipped_and_named_for_its_stage():
    on_disk = {p.name for p in stages.CONFIG_DIR.glob("*.json")}
    assert on_disk == {s.config_file for s in stages.TABLE}
    for path in stages.CONFIG_DIR.glob("*.json"):
        json.loads(path.read_text())


def test_pin_memory_off_keeps_everything_else():
    config = stages.shipped_config("3-offload-all")
    unpinned = stages.without_pinned_memory(config)
    assert unpinned["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    assert unpinned["zero_optimization"]["offload_param"]["pin_memory"] is False
    unpinned["zero_optimization"]["offload_optimizer"]["pin_memory"] = True
    unpinned["zero_optimization"]["offload_param"]["pin_memory"] = True
    assert unpinned == config


def test_escalation_order_uses_less_gpu_memory_each_time():
    """Full precision first, then 8-bit state at no lower a stage, then offload; as SFT_OPTIMIZER allows."""
    assert stages.NAMES == ("1", "2", "3", "1-8bit", "2-8bit", "3-8bit", "3-offload", "3-offload-all")
    assert [stages.next_after(s) for s in stages.NAMES] == ["2", "3", "3-8bit", "2-8bit", "3-8bit", "3-offload",
                                                            "3-offload-all", None]
    assert [stages.next_after(s, "adamw") for s in ("1", "2", "3")] == ["2", "3", "3-offload"]
    assert [stages.next_after(s, "adamw-8bit") for s in ("1-8bit", "2-8bit", "3-8bit")] == ["2-8bit", "3-8bit", None]
    # one GPU: ZeRO-3 shards nothing there, so 8-bit ZeRO-2 comes first, for auto and for the escalation
    assert stages.preference(1) == ("2", "1", "2-8bit", "1-8bit", "3", "3-8bit", "3-offload", "3-offload-all")
    assert [stages.next_after(s, world=1) for s in ("1", "2", "2-8bit", "3")] == ["2", "2-8bit", "3-8bit", "3-8bit"]
    assert stages.next_after("2", "adamw", world=1) == "3"


def test_a_users_config_is_named_by_what_it_offloads():
    zero2_offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    stage = stages.of_config(zero2_offload)
    assert (stage.name, stage.zero, stage.offload, stage.config_file) == ("2-offload", 2, True, "")
    none = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"}}}
    assert stages.of_config(none) == stages.get("3")
