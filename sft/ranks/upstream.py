"""Fixes for bugs and costs of the libraries the ranks run, each until its library fixes it (say when to
remove it).

Written here, not worked around in the planner, because each keeps a combination the planner needs: the
alternative is to refuse it, or to wait minutes for it.
"""

from __future__ import annotations

import functools
import os

import torch

from ..planner.memory import MASK_ELEMENTS_AT_ONCE


def fused_head_with_offloaded_checkpoints() -> None:
    """TRL 1.16's fused LM head under ZeRO-3 with checkpoints kept in host memory (activation offloading).

    The head's backward gathers `lm_head.weight` again with `maybe_gather_lm_head_ctx`, which reads ZeRO-3's
    `ds_status` from it. With offloading on, autograd hands the saved weight to the offload hooks as a plain
    tensor (a detached alias, not the Parameter), TRL's hooks copy it to host memory as an activation, and the
    backward gets back a plain tensor holding the full, gathered weight: `AttributeError: 'Tensor' object has
    no attribute 'ds_status'` (seen on an H200, 2026-12-01, ZeRO-3 with SFT_GRADIENT_CHECKPOINTING=offload,
    2,048 tokens a row; docs/long-rows.md). A tensor that is not ZeRO-3's needs no gathering: it is passed by.
    Remove when TRL's maybe_gather_lm_head_ctx skips tensors without ds_status."""
    from trl.trainer import utils

    original = utils.maybe_gather_lm_head_ctx
    if getattr(original, "passes_plain_tensors", False):
        return

    @functools.wraps(original)
    def gather_zero3_parameters_only(*params):
        for p in params:
            if p is not None and not hasattr(p, "ds_status") and p.numel() == 0:
                raise RuntimeError("the LM head's saved weight is empty and not ZeRO-3's to gather: "
                                   "ZeRO-3 freed it before the backward (sft/ranks/upstream.py)")
        return original(*(p for p in params if p is None or hasattr(p, "ds_status")))

    gather_zero3_parameters_only.passes_plain_tensors = True
    # trl.trainer.utils calls it by its global name, and trl.kernels.chunked_logprob imports it from there
    # at each backward, so replacing the module's attribute reaches both.
    utils.maybe_gather_lm_head_ctx = gather_zero3_parameters_only


# MASK_ELEMENTS_AT_ONCE: elements of the boolean mask evaluated at once (64 MB; the planner counts its
# temporaries, planner/memory.py): a band of query rows at a time, so a row of 131,072 tokens never holds its
# whole 131,072^2 mask (17 GB) beside the training's own peak. Bands of 2^24 to 2^28 elements took the same time
# on CPU (2.7 s at 16,384 tokens).


def block_mask_by_rows(mask_mod, batch: int, heads: int, q_length: int, kv_length: int, device,
                       elements: int = MASK_ELEMENTS_AT_ONCE):
    """The BlockMask `create_block_mask(mask_mod, ..., _compile=False)` makes, built from the mask evaluated a
    band of query rows at a time instead of whole (then torch's own block reduction)."""
    from torch.nn.attention import flex_attention as fa

    block = fa._DEFAULT_SPARSE_BLOCK_SIZE
    band = max(block, elements // max(1, batch * heads * kv_length) // block * block)
    partial, full = [], []
    for start in range(0, q_length, band):
        dense = dense_mask(mask_mod, batch, heads, start, min(band, q_length - start), kv_length, device)
        p, f = fa._convert_mask_to_block_mask(dense, Q_BLOCK_SIZE=block, KV_BLOCK_SIZE=block,
                                              separate_full_blocks=True)
        partial.append(p)
        full.append(f)
        del dense
    return fa._create_sparse_block_from_block_mask((torch.cat(partial, 2), torch.cat(full, 2)), mask_mod,
                                                   (q_length, kv_length), block, block)


def dense_mask(mask_mod, batch: int, heads: int, start: int, rows: int, kv_length: int, device) -> torch.Tensor:
    """mask_mod over query rows start .. start + rows - 1, as a (batch, heads, rows, kv_length) boolean tensor,
    evaluated once on broadcast index tensors. torch's create_mask vmaps it over the four indices instead:
    on an H200 that re-ran the mask's Python under four vmap levels at every forward, with the GPU idle (a
    third of a default step's idle time, docs/speed.md). Transformers' mask functions are written for both
    (its sdpa_mask evaluates them broadcast); tests/test_block_mask.py holds the result to torch's."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, heads, 1, 1)
    q = torch.arange(start, start + rows, device=device).view(1, 1, rows, 1)
    kv = torch.arange(kv_length, device=device).view(1, 1, 1, kv_length)
    return torch.as_tensor(mask_mod(b, h, q, kv), dtype=torch.bool, device=device).expand(
        batch, heads, rows, kv_length)


def flex_block_mask_uncompiled() -> None:
    """Transformers 5.24 builds flex attention's block mask with `create_block_mask(..., _compile=True)`: a
    new row length compiles a Triton kernel whose build grows with the length. On an H200 (2026-12-01) the
    first step at 16,384 tokens a row spent four minutes there with the GPU idle (py-spy: ptxas, called from
    create_block_mask), and the job took 279.9 s from its start to its first step; with the mask built here,
    58.6 s (another H200; docs/long-rows.md). The mask is evaluated directly instead, a band of query rows
    at a time, with nothing to compile; it costs O(length^2) element operations a step, on the GPU. The
    preparation around it (padding, offsets) is Transformers' own helpers', as in its `flex_attention_mask`.
    Registered for "flex_attention" through Transformers' AttentionMaskInterface; remove when Transformers
    stops compiling the mask or its compile no longer grows with the row."""
    from transformers import masking_utils as mu

    def flex_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                            mask_function=mu.causal_mask_function, attention_mask=None, device="cpu", **kwargs):
        if attention_mask is not None and not mu.fast_all(attention_mask):
            padding = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
            mask_function = mu.and_masks(mask_function, mu.padding_mask_function(padding))
        mask_function = mu.add_offsets_to_mask_function(mask_function, q_offset, kv_offset)
        return block_mask_by_rows(mask_function, batch_size, 1, q_length, kv_length, device)

    mu.AttentionMaskInterface.register("flex_attention", flex_attention_mask)


def packed_rows_unchecked() -> None:
    """Transformers 5.24's causal mask, for each forward of packed rows, asks the GPU whether the row holds more than
    one sequence (`find_packed_sequence_indices`: `.all()` on a GPU tensor, a wait for the GPU's queue; reads.py
    says what such a wait costs). FlashAttention's mask (`flash_attention_mask`) is None for rows without padding
    whatever the answer: the kernel takes the sequences' bounds from TRL's collator (cu_seq_lens). So with
    FlashAttention-4 the question is not asked. Remove when Transformers skips it for FlashAttention itself."""
    from transformers import masking_utils as mu

    mu.find_packed_sequence_indices = lambda position_ids: None


def every_position_scored() -> None:
    """TRL 1.16's fused LM head scores only the positions with a label (`hidden_states[mask]`), a boolean index whose
    size the host must read from the GPU: four waits for the GPU's queue a micro-step, two in the forward and two
    in the backward (reads.py says what such a wait costs). With the loss on every token the positions without a
    label are one per packed conversation, so scoring all of them (TRL's own path off Triton devices: the same
    losses, the unlabelled positions zeroed) costs about nothing and waits for nothing. Only then: with the loss
    on the assistant's turns or completions the skipped prompt tokens are worth the waits. Remove when TRL's
    compact path no longer reads the count."""
    from trl.trainer import utils

    utils._use_triton = lambda device: False


def lm_head_tiles_kept(budget: int) -> None:
    """TRL 1.16's fused LM head projects every logits tile twice, once in the forward and again in its backward
    (6.4 TFLOP a step for Qwen3-4B at 8,192 tokens). lm_head.py's restatement keeps up to `budget` bytes of the
    forward's tiles for the backward (the planner's choice, RunSpec.head_tiles_kept_bytes; 0 keeps none and is
    TRL's own). Remove when TRL keeps the tiles."""
    from trl.trainer import utils

    from .lm_head import TilesKeptLogProb

    TilesKeptLogProb.budget = budget
    utils._ChunkedLogProbFunction = TilesKeptLogProb  # _fused_forward calls it by its global name


def flash_attention_4(outside_compile: bool, kernels_ahead_lock: str = "") -> None:
    """Transformers 5.24's FlashAttention-4 forward, registered for "flash_attention_4" through its
    AttentionInterface with two changes.

    Outside the compiled graph (`outside_compile`, where the layers are compiled): Dynamo traces into Transformers'
    forward and flash-attn-4 4.0.0b36's Python interface, which break its graph several times and guard on what
    changes from layer to layer and batch to batch (`module.layer_idx`, the packed sequences' count, their longest
    length): it recompiled each layer until its recompile limit (8) and left the later layers' frames uncompiled.
    The attention call is a CuTe kernel either way, so it is run as it is, outside the compiled graph, which breaks
    there once. On an H200 (2026-12-03, Qwen3-4B shape, 2,048-token rows) the first run's warm-up fell from 47.4 s
    to 32.4 s and start to first step from 71.3 s to 57.5 s, the steady rate unchanged (17,365 against 17,480
    tokens/s; the same losses); docs/speed.md. Remove when flash-attn-4 registers its kernels as torch custom ops.

    After the kernels compiled ahead (`kernels_ahead_lock`: RunSpec.attention_lock): the first call waits for
    the process compiling them beside the rank's start (ranks/attention_ahead.py), then loads them from the
    persistent cache instead of compiling them again."""
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.modeling_utils import AttentionInterface

    forward = flash_attention_forward
    if kernels_ahead_lock:
        forward = _after_kernels_ahead(forward, kernels_ahead_lock)
    if outside_compile:
        forward = torch.compiler.disable(forward)
    AttentionInterface.register("flash_attention_4", forward)


def _after_kernels_ahead(forward, lock: str):
    from .attention_ahead import wait

    waited = []

    @functools.wraps(forward)
    def after(*args, **kwargs):
        if not waited:
            waited.append(wait(lock))
            if waited[0] >= 0.1 and int(os.environ.get("RANK", "0")) == 0:
                print(f"waited {waited[0]:.1f} s for FlashAttention-4's kernels compiled ahead", flush=True)
        return forward(*args, **kwargs)

    return after


def gradient_norm_in_fp32() -> None:
    """DeepSpeed 0.19.8's ZeRO-1/2 gradient norm (`get_grad_norm_direct`, each step, for clipping and the logged
    grad_norm) copies each gradient to fp64 and takes its norm, one parameter at a time: 398 copies and norms for
    Qwen3-4B, 27.4 ms of a 0.55 s step on an H200. torch's `_foreach_norm` with fp32 accumulation gives the same
    norm to 6 digits in 3.7 ms, reading the bf16 gradients in place (scripts/bench_optimizer_kernels.py;
    docs/speed.md). The same parameters count (DeepSpeed's filter, restated below: pipeline replicas once, model-
    parallel shards on their own rank), the same reductions follow, and a NaN or inf norm is masked as DeepSpeed
    masks it (the step's norm then reads inf, which the ranks stop on: progress.py). Only the L2 norm, the one
    ZeRO-1/2 clips with; any other goes to DeepSpeed's own. Remove when DeepSpeed stops computing the norm in fp64
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


def checkpoints_without_crc32() -> None:
    """torch.save, as DeepSpeed's checkpoint engine calls it, without a CRC32 of each record (torch's own switch,
    torch.utils.serialization.config.save.compute_crc32, on by default for zip tools). One H200's Qwen3-4B
    checkpoint (65 GB: ZeRO-2's fp32 weights and Adam state, the bf16 weights) took 95 s to write to a tmpfs, as
    long as 200 of its steps (docs/speed.md, 2026-12-03), and the checksum is one more pass over every byte on one
    core. torch.load reads such files as before (it does not check the CRC); `unzip -t` calls them corrupt. The
    Hub upload hashes each file itself. Remove it if torch turns the checksum off by default."""
    from torch.utils.serialization import config

    config.save.compute_crc32 = False


def checkpoints_by_records() -> None:
    """DeepSpeed's checkpoint engine writes its files through `saving.save` (the same file torch.save writes,
    each GPU storage copied through a small pinned ring into its record) instead of torch.save, which copies
    each GPU storage whole into new pageable memory at 1.2-1.4 GB/s on an H200 (saving.py says why and what it
    gave). Only the zip format, DeepSpeed's default; its legacy format goes to torch.save as before. Remove
    when torch.save copies GPU storages through bounded pinned memory itself."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from sft.ranks import saving

    original = TorchCheckpointEngine.save
    if getattr(original, "by_records", False):
        return

    @functools.wraps(original)
    def save(self, state_dict, path: str):
        if not self.zipfile_serialization:
            return original(self, state_dict, path)
        saving.save(state_dict, path)

    save.by_records = True
    TorchCheckpointEngine.save = save


def zero_step_in_one_pass() -> None:
    """DeepSpeed 0.19.8's ZeRO-1/2 step with its optimizer pass as one (sft/ranks/adamw.py says why and what it
    gives): DeepSpeed's own step, restated below for the one case it serves (16-bit weights in bf16, the
    optimizer torch's AdamW, no offload, Muon, MoE, loss scaling or overflow check, DeepSpeed's timers off), except
    that the gradients, once flattened, go to adamw.step instead of the fp32 cast, the clipping multiply, the
    optimizer and the copy back; and the clipping factor stays on the GPU (DeepSpeed asks the GPU whether the
    norm is finite first; an invalid norm is clipped as infinite, as DeepSpeed clips it). Any other case goes to
    DeepSpeed's own step. Remove when DeepSpeed's step reads 16-bit gradients into the optimizer itself."""
    from deepspeed.runtime.zero import stage_1_and_2 as zero
    from deepspeed.utils.timer import NoopTimer

    from sft.ranks import adamw, reads

    original = zero.DeepSpeedZeroOptimizer.step
    if getattr(original, "in_one_pass", False):
        return

    def served(self) -> bool:
        return (self.dtype == torch.bfloat16 and not self.cpu_offload and not self.zenflow
                and not self.torch_autocast_gradscaler and not self.check_grad_overflow and not self.has_moe_layers
                and self.loss_scale == 1.0 and not self.groups_lacking_loss_scale and not self._muon_pending_momentum
                and isinstance(self.timers, NoopTimer)
                and adamw.supports(self.optimizer, self.single_partition_of_fp32_groups[0].device))

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
            adamw.step(self.optimizer, i, self.single_partition_of_fp32_groups[i], flat,
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
