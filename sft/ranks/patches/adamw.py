"""ZeRO-1/2's optimizer step in one pass over memory: torch's AdamW from the 16-bit gradients, clipped, into the
fp32 master weights, and the 16-bit weights from them.

Why by hand: DeepSpeed 0.19.8's ZeRO-1/2 step (stage_1_and_2.py::step) casts the flattened gradients to a new fp32
buffer (4 bytes a parameter), multiplies it by the clipping factor, runs the optimizer on it, then copies the master
weights back into the 16-bit ones: four passes over memory where one would do, and it asks the GPU whether the norm is
finite (a synchronisation) before clipping. On a Qwen3-4B step the cast, the multiply and the copy back were a few
percent of the GPU's time (measured: docs/speed.md, 'where an idle GPU waits'; 'ZeRO-2's optimizer step in one pass').
torch's fused AdamW wants the gradient in the master weights' dtype, so the cast cannot be left out there. Here the
update is torch's AdamW written out (its `_single_tensor_adam` with decoupled weight decay), compiled on GPUs into one
kernel that reads the 16-bit gradient and writes both copies of the weights; on the host it runs as written, in slices.
The optimizer's state is torch's own (`step`, `exp_avg`, `exp_avg_sq` under the master weights), so checkpoints, their
resume and DeepSpeed's universal checkpoints read it as before.
"""

from __future__ import annotations

import torch

SLICE = 1 << 24  # elements per pass on the host: bounds the temporaries the written-out update makes


def supports(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
    """torch's AdamW as the Trainer makes it (`adamw_torch_fused`, the default, or `adamw_torch`): not amsgrad,
    maximize or differentiable; on a GPU, with its step counter on the GPU (fused or capturable)."""
    if type(optimizer) is not torch.optim.AdamW:
        return False
    for group in optimizer.param_groups:
        if group.get("amsgrad") or group.get("maximize") or group.get("differentiable"):
            return False
        if device.type == "cuda" and not (group.get("fused") or group.get("capturable")):
            return False
    return device.type in ("cuda", "cpu")


@torch.no_grad()
def step(optimizer: torch.optim.Optimizer, group_index: int, master: torch.Tensor, gradient: torch.Tensor,
         weights: torch.Tensor, scale: torch.Tensor) -> None:
    """One AdamW step of `master` (the group's fp32 partition, its only parameter) from `gradient` x `scale`,
    then `weights` (its 16-bit partition) from it."""
    group = optimizer.param_groups[group_index]
    state = optimizer.state[master]
    if not state:  # as torch's AdamW makes it at its first step
        on_device = group.get("fused") or group.get("capturable")
        state["step"] = torch.zeros((), dtype=torch.float32, device=master.device if on_device else "cpu")
        state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(master, memory_format=torch.preserve_format)
    state["step"] += 1
    beta1, beta2 = group["betas"]
    constants = dict(beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]),
                     weight_decay=float(group["weight_decay"]))
    lr, count = group["lr"], state["step"]
    if master.device.type == "cuda":
        lr = torch.full((), float(lr), dtype=torch.float32, device=master.device)  # a tensor: no recompile
        _compiled()(master, gradient, state["exp_avg"], state["exp_avg_sq"], weights, scale, lr, count, **constants)
        return
    for start in range(0, master.numel(), SLICE):
        part = slice(start, start + SLICE)
        update(master[part], gradient[part], state["exp_avg"][part], state["exp_avg_sq"][part], weights[part],
               scale, lr, count, **constants)


def update(master, gradient, exp_avg, exp_avg_sq, weights, scale, lr, count, *, beta1: float, beta2: float,
           eps: float, weight_decay: float) -> None:
    """torch.optim.AdamW's update of one tensor (torch/optim/adam.py, `_single_tensor_adam`, decoupled weight
    decay), in place, from the gradient in any dtype times `scale`; then the weights' copy in their dtype."""
    grad = gradient.float() * scale
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** count)
    denominator = (exp_avg_sq.sqrt() / (1 - beta2 ** count).sqrt()).add_(eps)
    master.sub_(step_size * (exp_avg / denominator))
    weights.copy_(master)


_compiled_update = None


def _compiled():
    global _compiled_update
    if _compiled_update is None:  # one graph per group's size and constants (two: with and without decay)
        # Not autotuned: a kernel that writes its inputs is timed on copies of them, as large as the optimizer's
        # state, which Inductor makes in host memory where the GPU has no room: the first step came more than a
        # minute later (measured: docs/speed.md, 'ZeRO-2's optimizer step in one pass'). A pointwise pass over
        # memory gains little from tuning.
        _compiled_update = torch.compile(update, fullgraph=True, dynamic=False,
                                         options={"triton.autotune_pointwise": False})
    return _compiled_update
