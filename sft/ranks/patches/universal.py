"""In every rank of a start that resumes from a universal checkpoint (a resume on another number of ranks,
controller/reshard.py): one repair of DeepSpeed's loading, made before the first step.

DeepSpeed's ZeRO-3 universal load (stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3, 0.19) gives
every sub-group's optimizer state the same `step` tensor object. torch's AdamW (and DeepSpeed's CPU Adam)
add 1 to their step tensor in place, once per sub-group, so with two sub-groups the count ran twice as
fast after the resume (measured: 18 at step 12 for a resume at step 6) and Adam's bias correction drifted
(losses 1e-3 off within 3 steps on the demo model). The Trainer's two parameter groups (with and without
weight decay) always make two sub-groups at least, a model above ZeRO-3's sub_group_size (1e9 parameters)
more. Each state gets a step tensor of its own here.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


class OwnSteps(TrainerCallback):
    """After the Trainer loaded the checkpoint (on_train_begin comes after), before the first step."""

    def __init__(self):
        self.trainer = None

    def on_train_begin(self, args, state, control, **kwargs):
        engine = getattr(self.trainer, "model_wrapped", None)
        if engine is None or not getattr(engine, "load_universal_checkpoint", lambda: False)():
            return
        unshared(engine.optimizer.optimizer.state.values())


def unshared(states) -> int:
    """Give each optimizer state whose `step` tensor another state also holds a copy of its own; how many."""
    seen, copied = set(), 0
    for s in states:
        step = s.get("step")
        if not isinstance(step, torch.Tensor):
            continue
        if id(step) in seen:
            s["step"] = step.clone()
            copied += 1
        seen.add(id(s["step"]))
    return copied
