"""What the decision is a function of, read once: the model's shape, the user's DeepSpeed file, and the
record of the checkpoint this start resumes from (the machine is measured in machine.py)."""

from __future__ import annotations

import functools
from pathlib import Path

from .. import checkpoints, exitcodes
from ..data.entries import looks_local
from ..planner.inputs import CannotRun, DataFacts, Inputs, Machine
from ..planner.shape import ModelShape, model_shape
from ..settings import Settings
from . import revisions


def read(s: Settings, machine: Machine, resume: Path | None = None, data: DataFacts | None = None) -> Inputs:
    """The decision's inputs (raises CannotRun when the model's config cannot be read)."""
    record = checkpoints.recorded(resume) if resume is not None else None
    try:
        revision = model_revision(s)
    except revisions.RevisionError as e:
        raise CannotRun(f"SFT_MODEL: {e}", exitcodes.BAD_SETTINGS) from None
    return Inputs(settings=s, machine=machine, shape=shape_of(s.model, revision), record=record,
                  user_config=s.user_ds_config, data=data, model_revision=revision)


def model_revision(s: Settings) -> str | None:
    """SFT_MODEL_REVISION (unset: main) as a commit; None for a local folder (raises RevisionError)."""
    return None if looks_local(s.model) else _commit(s.model, s.model_revision)


@functools.lru_cache(maxsize=8)  # the data step and the decision's inputs ask once each
def _commit(model: str, revision: str | None) -> str | None:
    return revisions.resolve(model, "model", revision)


def shape_of(model: str, revision: str | None = None) -> ModelShape:
    """The model's shape from its config.json, or a one-line reason it cannot be read."""
    try:
        return model_shape(model, revision)
    except (OSError, ValueError) as e:  # not found, offline and not cached, or not a model config
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CannotRun(f"SFT_MODEL={model!r}: cannot read its config.json ({why}): check the name or path, "
                        "the network, and HF_HUB_OFFLINE", exitcodes.BAD_SETTINGS) from None
