"""The DeepSpeed config a run uses: a shipped one chosen by stage, or the user's own.

"auto" values stay "auto": the Trainer fills them from its own arguments, so the two never disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent.parent / "ds_configs"
FILES = {
    "1": "zero1.json",
    "2": "zero2.json",
    "3": "zero3.json",
    "3-offload": "zero3_offload.json",
    "3-offload-all": "zero3_offload_all.json",
}
# The order in which the job escalates when a stage does not fit: less memory each time.
ESCALATION = ("1", "2", "3", "3-offload", "3-offload-all")


def next_stage(stage: str) -> str | None:
    """The option that uses less GPU memory than `stage`, or None if it is the last."""
    i = ESCALATION.index(stage)
    return ESCALATION[i + 1] if i + 1 < len(ESCALATION) else None


def load(stage: str, user_config: str | None = None) -> dict[str, Any]:
    """The config for a stage, or the user's file (which wins)."""
    path = Path(user_config) if user_config else CONFIG_DIR / FILES[stage]
    return json.loads(path.read_text())


def stage_of(config: dict[str, Any]) -> str:
    """Name a config's option the way SFT_ZERO_STAGE does (for reports of a user's own config)."""
    zero = config.get("zero_optimization", {})
    stage = str(zero.get("stage", 0))
    if zero.get("offload_param", {}).get("device", "none") != "none":
        return stage + "-offload-all"
    if zero.get("offload_optimizer", {}).get("device", "none") != "none":
        return stage + "-offload"
    return stage


def without_pinned_memory(config: dict[str, Any]) -> dict[str, Any]:
    """The same config with pin_memory off: pinned host memory counts against `ulimit -l`."""
    config = json.loads(json.dumps(config))
    for key in ("offload_optimizer", "offload_param"):
        section = config.get("zero_optimization", {}).get(key)
        if section:
            section["pin_memory"] = False
    return config


def write(config: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def filled(config: dict[str, Any], args: Any, world_size: int, model_config: Any, total_steps: int) -> dict[str, Any]:
    """The config with every "auto" filled as the Trainer fills it, by transformers' own code.

    `args` is the run's SFTConfig made without a DeepSpeed config (so no process group starts here);
    its world size is this process's, so the run's is given.
    """
    from types import SimpleNamespace

    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class _RunArgs:
        def __init__(self):
            self.world_size = world_size

        def __getattr__(self, name):
            return getattr(args, name)

    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    hf.trainer_config_process(_RunArgs())
    hf.trainer_config_finalize(_RunArgs(), SimpleNamespace(config=model_config), total_steps)
    return hf.config
