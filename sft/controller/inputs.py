"""What the decision is a function of, read once: the model's shape, the user's DeepSpeed file, and the
record of the checkpoint this start resumes from (the machine is measured in machine.py)."""

from __future__ import annotations

from pathlib import Path

from .. import checkpoints, exitcodes
from ..planner.inputs import CannotRun, Inputs, Machine
from ..planner.shape import ModelShape, model_shape
from ..settings import Settings


def read(s: Settings, machine: Machine, resume: Path | None = None) -> Inputs:
    """The decision's inputs (raises CannotRun when the model's config cannot be read)."""
    record = checkpoints.recorded(resume) if resume is not None else None
    return Inputs(settings=s, machine=machine, shape=shape_of(s.model), record=record,
                  user_config=s.user_ds_config)


def shape_of(model: str) -> ModelShape:
    """The model's shape from its config.json, or a one-line reason it cannot be read."""
    try:
        return model_shape(model)
    except (OSError, ValueError) as e:  # not found, offline and not cached, or not a model config
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CannotRun(f"SFT_MODEL={model!r}: cannot read its config.json ({why}): check the name or path, "
                        "the network, and HF_HUB_OFFLINE", exitcodes.BAD_SETTINGS) from None
