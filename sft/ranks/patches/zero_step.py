"""DeepSpeed 0.19.8's ZeRO-1/2 step: the gradient norm in fp32, and the optimizer's pass as one (adamw.py); each
until DeepSpeed changes (its "Remove when")."""

from __future__ import annotations

import functools

import torch


def gradient_norm_in_fp32() -> None:
    """DeepSpeed 0.19.8's ZeRO-1/2 gradient norm (`get_grad_norm_direct`, each step, for clipping and the logged
    grad_norm) copies each gradient to fp64 and takes its norm, one parameter at a time: 398 copies and norms for
    Qwen3-4B, several percent of a step. torch's `_foreach_norm` with fp32 accumulation gives the same norm to 6 digits
    in a fraction of the time, reading the bf16 gradients in place (scripts/bench_optimizer_kernels.py; measured:
    docs/speed.md, 'the gradient norm in fp32'). The same parameters count (DeepSpeed's filter, restated below: pipeline
    replicas once, model-parallel shards on their own rank), the same reductions follow, and a NaN or inf norm is masked
    as DeepSpeed masks it (the step's norm then reads inf, which the ranks stop on: progress.py). Only the L2 norm, the
    one ZeRO-1/2 clips with; any other goes to DeepSpeed's own. Remove when DeepSpeed stops computing the norm in fp64
    one tensor at a time."""
    from deepspeed.runtime.zero import stage_1_and_2 as zero

    original = zero.DeepSpeedZeroOptimizer.get_grad_norm_direct
    if getattr(original, "in_fp32", False):
        return

    @functools.wraps(original)
    def get_grad_norm_direct(self, gradients, params, norm_type=2):
        if float(norm_type) != 2.0:
            return original(self, gradients, params, norm_type)
        unpadded = (g for g in gradients if not getattr(g, "_zero_padding", False))
        kept = [g.data for g, p in zip(unpadded, params)
                if not (hasattr(p, zero.PIPE_REPLICATED) and p.ds_pipe_replicated)
                and (zero.is_model_parallel_parameter(p) or self.model_parallel_rank == 0)]
        if kept:  # each tensor's norm in fp32, their squares summed in fp64 (398 numbers)
            norms = torch.stack(torch._foreach_norm(kept, 2, dtype=torch.float32))
            total = norms.double().square().sum().float()
        else:
            total = torch.zeros((), dtype=torch.float32, device=self.device)
        zero.dist.all_reduce(total, op=zero.dist.ReduceOp.SUM, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=total, op=zero.dist.ReduceOp.SUM)
        total = total.sqrt()
        # DeepSpeed's mask_nan_or_inf_with_val_inplace, without its torch.tensor(-1.0, device=...), a copy from
        # the host that waits for the GPU's queue (reads.py says what that costs)
        total.masked_fill_(~torch.isfinite(total), -1.0)
        return total

    get_grad_norm_direct.in_fp32 = True
    zero.DeepSpeedZeroOptimizer.get_grad_norm_direct = get_grad_norm_direct


def zero_step_in_one_pass() -> None:
    """DeepSpeed 0.19.8's ZeRO-1/2 step with its optimizer pass as one (sft/ranks/patches/adamw.py says why and what it
    gives): DeepSpeed's own step, restated below for the one case it serves (16-bit weights in bf16, the
    optimizer torch's AdamW or bitsandbytes' 8-bit AdamW (adamw8bit.py), no offload, Muon, MoE, loss scaling or
    overflow check, DeepSpeed's timers off), except that the gradients, once flattened, go to the optimizer's step
    here instead of the fp32 cast, the clipping multiply, the optimizer and the copy back; and the clipping factor
    stays on the GPU (DeepSpeed asks the GPU whether the norm is finite first; an invalid norm is clipped as
    infinite, as DeepSpeed clips it). Any other case goes to DeepSpeed's own step. Remove when DeepSpeed's step
    reads 16-bit gradients into the optimizer itself."""
    from deepspeed.runtime.zero import stage_1_and_2 as zero
    from deepspeed.utils.timer import NoopTimer

    from . import adamw, adamw8bit, reads

    original = zero.DeepSpeedZeroOptimizer.step
    if getattr(original, "in_one_pass", False):
        return

    def served(self) -> bool:
        return (self.dtype == torch.bfloat16 and not self.cpu_offload and not self.zenflow
                and not self.torch_autocast_gradscaler and not self.check_grad_overflow and not self.has_moe_layers
                and self.loss_scale == 1.0 and not self.groups_lacking_loss_scale and not self._muon_pending_momentum
                and isinstance(self.timers, NoopTimer) and stepper(self) is not None)

    def stepper(self):
        """The module whose step serves the optimizer: torch's AdamW (adamw.py) or bitsandbytes' 8-bit one."""
        device = self.single_partition_of_fp32_groups[0].device
        return next((m for m in (adamw, adamw8bit) if m.supports(self.optimizer, device)), None)

    @functools.wraps(original)
    def step(self, closure=None):
        if not served(self):
            return original(self, closure)
        self.micro_step_id = zero.INITIAL_MICRO_STEP_ID
        self.overflow = False
        norm = self.scaled_global_norm() if self.compute_grad_norm else None
        # the Trainer logs it: read here, before the optimizer's kernel is queued behind it (reads.py)
        self.norm_read = reads.Read(norm) if norm is not None else None
        self._update_scale(False)
        self._global_grad_norm = norm  # / the loss scale, 1
        scale = torch.ones((), dtype=torch.float32, device=self.single_partition_of_fp32_groups[0].device)
        if self.clip_grad > 0.0 and norm is not None:  # DeepSpeed's unscale_and_clip_grads, without asking the GPU
            norm = torch.where(torch.isfinite(norm) & (norm >= 0), norm, torch.full_like(norm, float("inf")))
            scale = 1.0 / torch.clamp((norm + 1e-6) / self.clip_grad, min=1.0)
        for i in range(len(self.bit16_groups)):
            partition_id = zero.dist.get_rank(group=self.real_dp_process_group[i])
            self.free_grad_in_param_list(self.params_not_in_partition[i])
            flat = self._get_preflattened_grad_partition(i)
            if flat is None:
                if partition_id == zero.dist.get_world_size(group=self.real_dp_process_group[i]) - 1:
                    flat = self.flatten_dense_tensors_aligned(self.averaged_gradients[i], int(self.partition_size[i]))
                else:
                    flat = self.flatten(self.averaged_gradients[i])
            self.free_grad_in_param_list(self.params_in_partition[i])
            self._release_preflattened_grad_buffers(i)
            self.averaged_gradients[i] = None
            self.all_grad_tensors[i] = None
            stepper(self).step(self.optimizer, i, self.single_partition_of_fp32_groups[i], flat,
                               self.parallel_partitioned_bit16_groups[i][partition_id], scale)
            del flat
        self._lazy_init_hp_params_optimizer_state()
        zero.all_gather_dp_groups(groups_flat=self.bit16_groups_flat,
                                  partitioned_param_groups=self.parallel_partitioned_bit16_groups,
                                  dp_process_group=self.real_dp_process_group,
                                  start_alignment_factor=self.nccl_start_alignment_factor,
                                  allgather_bucket_size=self.allgather_bucket_size)
        for i in range(len(self.bit16_groups)):
            self._update_model_bit16_weights(i)

    step.in_one_pass = True
    zero.DeepSpeedZeroOptimizer.step = step
