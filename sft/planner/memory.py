"""What one GPU holds at its peak under a ZeRO option: each term of the planner, in bytes.

    model states    DeepSpeed's own estimator functions (called, not re-derived); with 8-bit AdamW, less the
                    moments' bytes it saves
  + accumulation    ZeRO-1/2 with several micro-batches per step: a 16-bit gradient partition
  + the larger of
      backward      activations (what autograd keeps; a Llama/Qwen-style decoder, SDPA or flash
                    attention) + logits (TRL's fused LM head, or the full logits) + DeepSpeed's
                    communication buckets (from the DeepSpeed config)
      optimizer     the fp32 gradient partition DeepSpeed builds for Adam, once activations are gone
                    (the flattened 16-bit one with the job's one-pass step, which makes no fp32 one)
                    (with offload: the 16-bit staging on its way to the host, during the backward)
      mask build    flex attention's block mask, built before each forward (its temporaries)
  + margin          allocator fragmentation and the CUDA context

Every coefficient is a named constant, fitted to measured peaks; docs/memory-planner.md has the grid
('The planner against measured memory') and tests/test_plan.py holds every point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..stages import Stage
from ..units import GIB
from .shape import ModelShape

# --- DeepSpeed's estimator, as the seed calls it
ADDITIONAL_BUFFER_FACTOR = 1.5  # DeepSpeed's default
ZERO_INIT = True  # Transformers shards the model while loading when the DeepSpeed config comes first
ESTIMATOR_STATE_BYTES = 8  # per parameter: the two fp32 Adam moments DeepSpeed's estimators count
# bitsandbytes' 8-bit AdamW (stages.EIGHT_BIT_OPTIM): two uint8 moments and, for each, an fp32 absmax per block of 256
# (bitsandbytes/optim/optimizer.py, Optimizer8bit: blocksize 256); tensors under 4,096 elements stay fp32, but
# DeepSpeed hands it one flat partition per parameter group.
EIGHT_BIT_STATE_BYTES = 2 * (1 + 4 / 256)

# --- Activations: elements autograd saves per token and layer, 16-bit (ACT_BYTES each)
ACT_BYTES = 2
NORM_SAVED = 3  # RMSNorm (per element of h): its fp32 upcast input (2 bf16-sized units) + the bf16 output
QK_NORM_SAVED = 3  # Qwen3's per-head q_norm/k_norm: the same RMSNorm, over (heads + kv heads) x head_dim
SDPA_REPEATS_KV = True  # Transformers' SDPA path copies k, v to every query head when a mask is passed
ATTN_OUT_SAVED = 2  # attention output (saved by SDPA) + its transposed contiguous copy (o_proj's input)
MLP_SAVED = 4  # SwiGLU, per intermediate element: gate, silu(gate), up, silu(gate)*up (down_proj's input)
# With Liger's kernels: its RMSNorm keeps the bf16 input (and a per-row rstd), not the fp32 upcast and
# the output; its SwiGLU keeps gate and up and recomputes silu (docs/memory-planner.md: measured).
LIGER_NORM_SAVED = 1
LIGER_MLP_SAVED = 3
CKPT_LIVE_LAYERS = 1  # checkpointing: layers whose full activations exist at once (the one recomputed)
# Checkpoints offloaded to the host (TRL's activation_offloading): its forward stash keeps 5 tensors alive
# on the GPU (trl/models/activation_offloading.py, max_fwd_stash_size), and the backward brings each
# layer's input back just before it is needed; a layer's input is one such tensor.
OFFLOAD_GPU_LAYERS = 6

# --- Logits. TRL's SFTTrainer computes the loss through a fused LM head (trl/kernels/chunked_logprob)
# that never builds the [tokens, vocab] logits: it projects [4096 tokens, 32768 vocab] tiles and, in
# backward, accumulates the LM head's weight gradient in fp32 over the whole vocabulary.
FUSED_LM_HEAD = True
TRL_TOKEN_TILE = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
TRL_VOCAB_TILE = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE
TILE_BYTES = 2  # the bf16 tile buffer
# The forward's tiles kept for the backward (sft/ranks/patches/lm_head.py), so that it does not project them again: up
# to this share of the GPU's memory, and only of what the plan leaves free (plan.py: they never make a plan not fit). 3%
# holds all of Qwen3's 8,192 x 151,936 tiles (2.32 GiB, the defaults) on an 80 GiB GPU.
HEAD_KEPT_FRACTION = 0.03
LM_HEAD_GRAD_BYTES = 6  # per LM head parameter: fp32 accumulator + its bf16 copy handed to autograd
HIDDEN_GRAD_BYTES = 6  # per token x hidden: the same for the hidden states' gradient
# Without the fused head (label smoothing, a custom loss): bf16 logits + the fp32 upcast the loss
# makes + the fp32 log-softmax kept for backward.
LOGITS_MATERIALIZED_BYTES = 2 + 4 + 4

# --- Communication buckets, in elements of the DeepSpeed config, COMM_BYTES each (bf16)
COMM_BYTES = 2
# The Transformers DeepSpeed docs: "overlap_comm uses 4.5x the allgather_bucket_size and
# reduce_bucket_size values ... set to 2e8, which would require 3.6GB" (2e8 x 2 bytes x 2 x 4.5).
OVERLAP_COMM_FACTOR = 4.5
STAGE3_BUCKET_COPIES = 2  # stage 3: the reduce and prefetch buckets, double-buffered with overlap_comm
# DeepSpeed's defaults when a key is missing (deepspeed/runtime/zero/config.py)
DS_DEFAULTS = {"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8,
               "stage3_prefetch_bucket_size": 5e7, "sub_group_size": 1e9}

# --- The optimizer step: DeepSpeed upcasts the gradient partition to fp32 for Adam (stage 1-2: all of
# it; stage 3: one sub-group at a time). Activations are freed by then, so the step and the backward
# are two peaks, and the plan takes the larger (ZeRO-2 with checkpointing peaks here whatever the
# tokens per micro-batch: docs/memory-planner.md).
STEP_FP32_GRAD_BYTES = 4
# ZeRO-1/2's step in one pass (sft/ranks/patches/adamw.py: bf16 on GPUs, torch's fused AdamW, no offload) makes no
# fp32 gradient partition: not the 4 bytes DeepSpeed's estimator counts with the model states, not the step's
# 4 above; its step holds the flattened 16-bit gradients instead, and the peak fell by that partition (measured:
# docs/memory-planner.md, 'Since: ZeRO-1/2's step in one pass').
ONE_PASS_STEP_BYTES = 2
# With checkpointing, that flattened copy is one block the backward's freed memory cannot hold: torch's allocator had
# put the backward's small tensors into DeepSpeed's fp32 gradient partition, which its initialize_optimizer_states
# makes and frees at the start (stage_1_and_2.py, 4 bytes a parameter) and which stays reserved, and it reserves a new
# block for the copy. So the step adds to the backward's memory, not instead of it. Measured with the allocator's
# history (docs/memory-planner.md, 'the one-pass step beside the checkpointed backward'): Qwen3-4B at full precision
# on an H100, 4 x 2,048, 74.93 GiB reserved; Qwen3-8B with 8-bit AdamW on an H200, 99.19. Without checkpointing the
# backward's large freed blocks hold it (92.94 and 63.0 GiB measured below their plans): step_beside_backward.
# With the optimizer offloaded, a 16-bit sub-group staged on the GPU during the backward, on its way to
# the host (fitted to the one offload run measured, docs/memory-planner.md).
OFFLOAD_STAGING_BYTES = 2
# --- Gradient accumulation: with more than one micro-batch per step, ZeRO-1 and 2 keep a 16-bit
# gradient partition across them (measured the same at accumulation 2 and 4). Stage 3 accumulates
# into the fp32 partition its estimator already counts.
ACCUMULATION_BYTES = 2

# --- Margin. Of the larger peak: the caching allocator's unusable gaps, fitted to the measured grid
# (docs/memory-planner.md, 'The planner against measured memory'; the activation terms already over-count a little).
FRAGMENTATION = 0.01
CUDA_CONTEXT_GIB = 1.0  # CUDA context, cuBLAS workspace, NCCL buffers: outside torch's counters


def model_states(stage: Stage, total_params: int, largest_layer_params: int,
                 gpus_per_node: int, nodes: int = 1) -> tuple[int, int]:
    """(GPU bytes per GPU, host bytes per node) for the model states, from DeepSpeed's estimators (with 8-bit
    AdamW, less what its moments save on each GPU)."""
    gpu, host = _estimated_states(stage, total_params, largest_layer_params, gpus_per_node, nodes)
    if stage.eight_bit:
        gpu -= int((ESTIMATOR_STATE_BYTES - EIGHT_BIT_STATE_BYTES) * -(-total_params // (gpus_per_node * nodes)))
    return gpu, host


def _estimated_states(stage: Stage, total_params: int, largest_layer_params: int,
                      gpus_per_node: int, nodes: int) -> tuple[int, int]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if stage.zero in (1, 2):
        host, gpu = estimate_zero2_model_states_mem_needs(
            total_params, gpus_per_node, nodes, cpu_offload=stage.offload_optimizer,
            additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR)
        if stage.zero == 1:
            # DeepSpeed has no ZeRO-1 estimator. Its ZeRO-2 figure is 2 bytes/param of 16-bit weights
            # + 18/N (2 16-bit gradients, 4 fp32 gradients, 4 fp32 weights, 8 Adam moments). ZeRO-1
            # shards the same except the 16-bit gradients, which every GPU holds in full until the
            # accumulation boundary: swap their 2/N for 2.
            total_gpus = gpus_per_node * nodes
            gpu += 2 * total_params - int(2 * total_params / total_gpus)
        return gpu, host
    host, gpu, _ = estimate_zero3_model_states_mem_needs(
        total_params, largest_layer_params, gpus_per_node, nodes,
        cpu_offload=stage.offload_optimizer, cpu_offload_params=stage.offload_params,
        zero_init=ZERO_INIT, additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR)
    return gpu, host


def layer_activation_elements(shape: ModelShape, liger: bool = False) -> int:
    """Elements one decoder layer saves for backward, per token (no s^2 term: SDPA/flash attention)."""
    h, d = shape.hidden_size, shape.head_dim
    q, kv = shape.num_heads * d, shape.num_kv_heads * d  # widths of q and of k (= v)
    norm_saved = LIGER_NORM_SAVED if liger else NORM_SAVED
    norms = 2 * norm_saved * h  # input_layernorm, post_attention_layernorm
    qk_norms = (norm_saved if liger else QK_NORM_SAVED) * (q + kv) if shape.qk_norm else 0
    k_v_seen = q if SDPA_REPEATS_KV else kv  # k and v as attention saves them
    # q after RoPE + k, v as attention sees them + the output and its copy; q/k/v_proj's input is
    # the norm's output, counted above, and RoPE's multiplications save the normed q/k, also above.
    attention = q + 2 * k_v_seen + ATTN_OUT_SAVED * q
    mlp = (LIGER_MLP_SAVED if liger else MLP_SAVED) * shape.intermediate_size
    return norms + qk_norms + attention + mlp


def activation_bytes(shape: ModelShape, micro_batch: int, max_length: int, gradient_checkpointing: bool,
                     liger: bool = False, offload: bool = False) -> int:
    """Activation bytes per GPU at the backward's peak (offload: the checkpoints live in host memory)."""
    tokens = micro_batch * max_length
    layer = layer_activation_elements(shape, liger) * tokens * ACT_BYTES
    if not gradient_checkpointing:
        return shape.num_layers * layer
    # each layer keeps only its input; backward recomputes one layer's activations at a time
    kept = min(shape.num_layers, OFFLOAD_GPU_LAYERS) if offload else shape.num_layers
    return kept * checkpoint_bytes(shape, tokens) + CKPT_LIVE_LAYERS * layer


def checkpoint_bytes(shape: ModelShape, tokens: int) -> int:
    """One layer's checkpoint: its input hidden states."""
    return tokens * shape.hidden_size * ACT_BYTES


def offloaded_activation_bytes(shape: ModelShape, micro_batch: int, max_length: int) -> int:
    """Host bytes per GPU of the checkpoints offloaded there."""
    return shape.num_layers * checkpoint_bytes(shape, micro_batch * max_length)


def logits_bytes(shape: ModelShape, micro_batch: int, max_length: int, fused: bool = FUSED_LM_HEAD,
                 kept: int = 0) -> int:
    """Bytes the LM head and the loss add per GPU; `kept`: bytes of its tiles kept for the backward
    (head_tiles_kept), beside the one buffer of the tiles computed again, which all kept need not."""
    tokens = micro_batch * max_length
    if not fused:
        return shape.vocab_size * tokens * LOGITS_MATERIALIZED_BYTES
    tile = 0 if kept >= head_tiles_bytes(shape, micro_batch, max_length) else \
        min(tokens, TRL_TOKEN_TILE) * min(shape.vocab_size, TRL_VOCAB_TILE) * TILE_BYTES
    weight_grad = shape.vocab_size * shape.hidden_size * LM_HEAD_GRAD_BYTES
    hidden_grad = tokens * shape.hidden_size * HIDDEN_GRAD_BYTES
    return kept + tile + weight_grad + hidden_grad


def head_tiles_bytes(shape: ModelShape, micro_batch: int, max_length: int) -> int:
    """Bytes of all the fused LM head's logits tiles of one micro-batch (every position scored)."""
    return micro_batch * max_length * shape.vocab_size * TILE_BYTES


def head_tiles_kept(shape: ModelShape, micro_batch: int, max_length: int, gpu_bytes: int, room: int) -> int:
    """Bytes of the LM head's tiles the ranks keep for the backward: all of them, up to HEAD_KEPT_FRACTION of the
    GPU and to `room`, what the plan leaves free counting their margin (0: TRL's own, every tile projected
    again). The ranks keep whole tiles up to this many bytes (sft/ranks/patches/lm_head.py)."""
    room = int(max(room, 0) / (1 + FRAGMENTATION))
    return max(0, min(head_tiles_bytes(shape, micro_batch, max_length), int(HEAD_KEPT_FRACTION * gpu_bytes), room))


def _elements(zero: Mapping[str, Any], key: str, auto: float | None = None) -> int:
    value = zero.get(key, DS_DEFAULTS[key])
    if value == "auto":  # Transformers fills these from hidden_size; DeepSpeed's default otherwise
        value = DS_DEFAULTS[key] if auto is None else auto
    return int(float(value))


def bucket_bytes(stage: Stage, hidden_size: int, zero: Mapping[str, Any]) -> int:
    """Bytes per GPU of DeepSpeed's communication buckets for a config's zero_optimization section."""
    h2 = hidden_size * hidden_size  # Transformers' "auto": reduce h^2, prefetch 0.9 h^2
    reduce = _elements(zero, "reduce_bucket_size", auto=h2)
    stage3 = stage.zero == 3
    overlap = zero.get("overlap_comm", stage3)  # DeepSpeed turns it on by default for stage 3 only
    if stage3:
        prefetch = _elements(zero, "stage3_prefetch_bucket_size", auto=int(0.9 * h2))
        return (reduce + prefetch) * COMM_BYTES * (STAGE3_BUCKET_COPIES if overlap else 1)
    allgather = _elements(zero, "allgather_bucket_size")
    return int((reduce + allgather) * COMM_BYTES * (OVERLAP_COMM_FACTOR if overlap else 1))


def optimizer_step_bytes(stage: Stage, total_params: int, total_gpus: int, zero: Mapping[str, Any],
                         one_pass_step: bool = False) -> int:
    """Bytes per GPU of the step's transient gradient: fp32 for Adam on the GPU (16-bit, flattened, with the
    one-pass step at ZeRO-1/2); with the optimizer on the CPU, the 16-bit sub-group staged on the GPU before
    its copy to the host."""
    partition = -(-total_params // total_gpus)
    if stage.zero == 3:  # stage 3 steps one sub-group at a time
        partition = min(partition, _elements(zero, "sub_group_size"))
    if stage.offload_optimizer:
        return OFFLOAD_STAGING_BYTES * partition
    if one_pass_step and stage.zero in (1, 2):
        return ONE_PASS_STEP_BYTES * partition
    return STEP_FP32_GRAD_BYTES * partition


def states_not_made(stage: Stage, total_params: int, total_gpus: int, one_pass_step: bool) -> int:
    """Bytes per GPU of DeepSpeed's model states estimate that the one-pass step never allocates: the fp32
    gradient partition (ZeRO-1/2 without offload)."""
    if not one_pass_step or stage.zero == 3 or stage.offload_optimizer:
        return 0
    return STEP_FP32_GRAD_BYTES * -(-total_params // total_gpus)


def busiest_phase(stage: Stage, backward: int, optimizer_step: int, step_beside_backward: bool = False) -> int:
    """What the forward/backward adds to the model states, or what the step adds, whichever is more.

    With the optimizer offloaded, gradients leave for the host during the backward: their staging is
    part of it. `step_beside_backward` (the function below): both, one on the other."""
    if stage.offload_optimizer or step_beside_backward:
        return backward + optimizer_step
    return max(backward, optimizer_step)


def step_beside_backward(stage: Stage, one_pass_step: bool, gradient_checkpointing: bool) -> bool:
    """Whether the one-pass step's flattened gradients are reserved beside the backward's memory, not in it
    (ONE_PASS_STEP_BYTES says why)."""
    return (one_pass_step and gradient_checkpointing and stage.zero in (1, 2)
            and not stage.offload_optimizer)


def accumulation_bytes(stage: Stage, total_params: int, total_gpus: int, grad_accum: int) -> int:
    """Bytes per GPU of the 16-bit gradient partition ZeRO-1/2 keep between micro-batches."""
    if grad_accum == 1 or stage.zero == 3:
        return 0
    return ACCUMULATION_BYTES * -(-total_params // total_gpus)


# --- Flex attention's block mask, built at each forward (sft/ranks/patches/masks.py::block_mask_by_rows): the boolean
# mask of at most MASK_ELEMENTS_AT_ONCE elements at a time, a band of query rows, then torch's block reduction, whose
# temporaries are wider than the mask: the allocator reserved MASK_BUILD_BYTES for each element evaluated at once, most
# of it in the block reduction's segments (measured: docs/memory-planner.md,
# 'Since: flex attention's mask build counted'). Nothing else is held then but the model states (the forward has not
# begun), so it is a peak of its own, beside the backward's and the step's; a tiny model's whole peak, which the plan
# had put far lower.
MASK_ELEMENTS_AT_ONCE = 1 << 26  # 64 MB of booleans; sft/ranks/patches/masks.py builds the mask by this
MASK_BUILD_BYTES = 19  # per element evaluated at once
MASK_BLOCK = 128  # flex attention's block (torch's _DEFAULT_SPARSE_BLOCK_SIZE): a band is whole blocks of rows


def flex_mask_elements(micro_batch: int, row_tokens: int, packing: bool) -> int:
    """Elements of flex attention's mask evaluated at once: packed rows arrive as one row of all the micro-batch's
    tokens (TRL's padding-free collator), unpacked as micro_batch rows; a band of query rows at a time, as
    masks.block_mask_by_rows cuts them."""
    batch, length = (1, micro_batch * row_tokens) if packing else (micro_batch, row_tokens)
    band = max(MASK_BLOCK, MASK_ELEMENTS_AT_ONCE // (batch * length) // MASK_BLOCK * MASK_BLOCK)
    return batch * min(band, length) * length


def mask_build_bytes(elements: int) -> int:
    return MASK_BUILD_BYTES * elements


def margin_bytes(unmargined: int) -> int:
    return int(FRAGMENTATION * unmargined) + int(CUDA_CONTEXT_GIB * GIB)
