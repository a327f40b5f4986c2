"""The memory planner: which ZeRO option fits this model on these GPUs, and why.

For each option it predicts what one GPU holds at its peak, the larger of two moments:

    model states    DeepSpeed's own estimator functions (called, not re-derived)
  + accumulation    ZeRO-1/2 with several micro-batches per step: a 16-bit gradient partition
  + the larger of
      backward      activations (what autograd keeps; a Llama/Qwen-style decoder, SDPA or flash
                    attention) + logits (TRL's fused LM head, or the full logits) + DeepSpeed's
                    communication buckets (from the DeepSpeed config)
      optimizer     the fp32 gradient partition DeepSpeed builds for Adam, once activations are gone
                    (with offload: the 16-bit staging on its way to the host, during the backward)
  + margin          allocator fragmentation and the CUDA context

and takes the first option, in PREFERENCE order, whose peak fits the GPU with GPU_FREE_FRACTION kept
free and whose host memory (offload only) fits the host. Every coefficient below is a named constant,
fitted to peaks measured on H200s (README, "The planner against measured memory"; tests/test_plan.py
holds every point): from +0.7% to +8.9% over the measured max_memory_reserved, and the two-GPU points,
measured after the fit, within the same band.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

GIB = 2**30  # GiB: bytes / 2**30, as DeepSpeed prints (it labels them GB)
OPTIONS = ("1", "2", "3", "3-offload", "3-offload-all")
# The rule: the lowest stage that fits, offload only when nothing else does (the seed's rule). ZeRO-1
# and ZeRO-2 count as one step: both move what plain data parallelism moves per step (ZeRO paper), so
# ZeRO-2, which holds less, goes first. ZeRO-1 can still be asked for by name; put "1" first here to
# prefer it (it reduces gradients once per accumulation cycle, ZeRO-2 on every micro-batch).
PREFERENCE = ("2", "1", "3", "3-offload", "3-offload-all")

# --- DeepSpeed's estimator, as the seed calls it
ADDITIONAL_BUFFER_FACTOR = 1.5  # DeepSpeed's default
ZERO_INIT = True  # Transformers shards the model while loading when the DeepSpeed config comes first

# --- Activations: elements autograd saves per token and layer, 16-bit (ACT_BYTES each)
ACT_BYTES = 2
NORM_SAVED = 3  # RMSNorm (per element of h): its fp32 upcast input (2 bf16-sized units) + the bf16 output
QK_NORM_SAVED = 3  # Qwen3's per-head q_norm/k_norm: the same RMSNorm, over (heads + kv heads) x head_dim
SDPA_REPEATS_KV = True  # Transformers' SDPA path copies k, v to every query head when a mask is passed
ATTN_OUT_SAVED = 2  # attention output (saved by SDPA) + its transposed contiguous copy (o_proj's input)
MLP_SAVED = 4  # SwiGLU, per intermediate element: gate, silu(gate), up, silu(gate)*up (down_proj's input)
# With Liger's kernels (SFT_LIGER_KERNELS): its RMSNorm keeps the bf16 input (and a per-row rstd), not the
# fp32 upcast and the output; its SwiGLU keeps gate and up and recomputes silu. These save 30,208
# elements per token and layer for Qwen3-4B; measured on one H200: 9.0 GiB less at 2 x 2,048 tokens
# without checkpointing (32,100 per token and layer).
LIGER_NORM_SAVED = 1
LIGER_MLP_SAVED = 3
CKPT_LIVE_LAYERS = 1  # checkpointing: layers whose full activations exist at once (the one recomputed)
# Measured on one H200 (torch 2.11, transformers 5.17, SDPA, Qwen3-4B shape, 2,048 tokens, bf16), the
# forward's saved memory per token and layer: 83,092 elements without an attention mask (this formula
# with SDPA_REPEATS_KV False: 83,968), 93,332 with a padding mask (formula: 90,112), and 2,560 = h
# with gradient checkpointing (formula: h).

# --- Logits. TRL 1.16's SFTTrainer computes the loss through a fused LM head (trl/kernels/chunked_logprob)
# that never builds the [tokens, vocab] logits: it projects [4096 tokens, 32768 vocab] tiles and, in
# backward, accumulates the LM head's weight gradient in fp32 over the whole vocabulary.
FUSED_LM_HEAD = True
TRL_TOKEN_TILE = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
TRL_VOCAB_TILE = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE
TILE_BYTES = 2  # the bf16 tile buffer
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
# The seed's configs, which ds_configs/ ships: used when plan() is given none
SEED_ZERO = {
    "1": {"stage": 1, "overlap_comm": True, "allgather_bucket_size": 2e8, "reduce_bucket_size": 2e8},
    "2": {"stage": 2, "overlap_comm": True, "allgather_bucket_size": 2e8, "reduce_bucket_size": 2e8},
    "3": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"},
}

# --- The optimizer step: DeepSpeed upcasts the gradient partition to fp32 for Adam (stage 1-2: all of
# it; stage 3: one sub-group at a time). Activations are freed by then, so the step and the backward
# are two peaks, and the plan takes the larger (measured: ZeRO-2 on one H200 peaks at 89.92 GiB, the
# model states plus this term, whether 2,048 or 4,096 tokens are checkpointed per micro-batch).
STEP_FP32_GRAD_BYTES = 4
# With the optimizer offloaded, a 16-bit sub-group staged on the GPU during the backward, on its way to
# the host (fitted to one measurement: FACTS.md run G, Qwen3-4B ZeRO-3-offload on one H200, 13.1 GiB;
# without it the plan said 12.1, 7% under).
OFFLOAD_STAGING_BYTES = 2
# --- Gradient accumulation: with more than one micro-batch per step, ZeRO-1 and 2 keep a 16-bit
# gradient partition across them (measured: +7.5 GiB for Qwen3-4B on one H200 at accumulation 2 and 4,
# the same at both). Stage 3 accumulates into the fp32 partition its estimator already counts.
ACCUMULATION_BYTES = 2

# --- Margin and the fit
# Of the larger peak: the caching allocator's unusable gaps. Fitted to the grid of 2026-11-29 (README,
# "The planner against measured memory"): the activation terms already over-count a little.
FRAGMENTATION = 0.01
CUDA_CONTEXT_GIB = 1.0  # CUDA context, cuBLAS workspace, NCCL buffers: outside torch's counters
GPU_FREE_FRACTION = 0.10  # keep this much of each GPU free: the plan is an estimate


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model the planner needs; build one by hand or with model_shape()."""

    name: str
    total_params: int  # counted once, tied embeddings included once
    largest_layer_params: int  # the largest single parameter tensor (Qwen3: the embedding)
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)


@dataclass(frozen=True)
class Setup:
    """The machine and the batch the plan is for."""

    gpus_per_node: int
    gpu_memory_gib: float  # what each GPU reports (torch's total_memory / 2**30)
    nodes: int = 1
    micro_batch: int = 1
    max_length: int = 2048
    gradient_checkpointing: bool = True
    host_memory_gib: float | None = None  # per node; None: not checked
    grad_accum: int = 1
    liger_kernels: bool = False

    @property
    def total_gpus(self) -> int:
        """GPUs in the whole job."""
        return self.gpus_per_node * self.nodes

    @property
    def gpu_budget(self) -> int:
        """Bytes a plan may use per GPU."""
        return int(self.gpu_memory_gib * (1 - GPU_FREE_FRACTION) * GIB)


@dataclass(frozen=True)
class Row:
    """One option's predicted memory, bytes per GPU (host: bytes per node)."""

    option: str
    model_states: int
    activations: int
    logits: int
    buckets: int
    optimizer_step: int
    accumulation: int
    margin: int
    host: int  # DeepSpeed's estimate of CPU memory
    fits_gpu: bool
    fits_host: bool | None  # None: not checked (no offload, or the host's memory was not given)
    why: str

    @property
    def peak(self) -> int:
        """The predicted peak per GPU: the larger of the backward's and the optimizer step's."""
        return self.model_states + self.accumulation + self.busiest_phase + self.margin

    @property
    def busiest_phase(self) -> int:
        return busiest_phase(self.option, self.activations + self.logits + self.buckets, self.optimizer_step)

    @property
    def fits(self) -> bool:
        """Fits the GPU, and the host where that was checked."""
        return self.fits_gpu and self.fits_host is not False


@dataclass(frozen=True)
class Plan:
    """Every option's row and the choice (None when nothing fits, with the reason)."""

    shape: ModelShape
    setup: Setup
    rows: tuple[Row, ...]
    choice: str | None
    reason: str

    def row(self, option: str) -> Row:
        """The row of one option ("1" ... "3-offload-all")."""
        return next(r for r in self.rows if r.option == option)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: sizes in GiB (bytes / 2**30, two decimals, like DeepSpeed)."""
        rows = []
        for r in self.rows:
            d = {k: _gib(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in asdict(r).items()}
            rows.append({**d, "peak": _gib(r.peak), "fits": r.fits})
        setup = {**asdict(self.setup), "gpu_budget": _gib(self.setup.gpu_budget)}
        return {"model": asdict(self.shape), "setup": setup, "options": rows,
                "choice": self.choice, "reason": self.reason}

    def to_json(self) -> str:
        """The plan as JSON text (see to_dict)."""
        return json.dumps(self.to_dict(), indent=2)


def _gib(n: int) -> float:
    return round(n / GIB, 2)


def model_shape(model: str) -> ModelShape:
    """Read a model's config.json (folder or Hub name) and count its parameters on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model)
    with torch.device("meta"):  # shapes only: no memory, no weights downloaded
        net = AutoModelForCausalLM.from_config(cfg)
    named = list(net.named_parameters())  # tied weights appear once
    text = cfg.get_text_config()
    heads = text.num_attention_heads
    return ModelShape(
        name=model,
        total_params=sum(p.numel() for _, p in named),
        largest_layer_params=max(p.numel() for _, p in named),
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_layers=text.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab_size=text.vocab_size,
        qk_norm=any(n.endswith("q_norm.weight") for n, _ in named),
    )


def model_states(option: str, total_params: int, largest_layer_params: int,
                 gpus_per_node: int, nodes: int = 1) -> tuple[int, int]:
    """(GPU bytes per GPU, host bytes per node) for the model states, from DeepSpeed's estimators."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if option in ("1", "2"):
        host, gpu = estimate_zero2_model_states_mem_needs(
            total_params, gpus_per_node, nodes, cpu_offload=False,
            additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR)
        if option == "1":
            # DeepSpeed has no ZeRO-1 estimator. Its ZeRO-2 figure is 2 bytes/param of 16-bit weights
            # + 18/N (2 16-bit gradients, 4 fp32 gradients, 4 fp32 weights, 8 Adam moments). ZeRO-1
            # shards the same except the 16-bit gradients, which every GPU holds in full until the
            # accumulation boundary: swap their 2/N for 2.
            total_gpus = gpus_per_node * nodes
            gpu += 2 * total_params - int(2 * total_params / total_gpus)
        return gpu, host
    host, gpu, _ = estimate_zero3_model_states_mem_needs(
        total_params, largest_layer_params, gpus_per_node, nodes,
        cpu_offload=option != "3", cpu_offload_params=option == "3-offload-all",
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
                     liger: bool = False) -> int:
    """Activation bytes per GPU at the backward's peak."""
    tokens = micro_batch * max_length
    layer = layer_activation_elements(shape, liger) * tokens * ACT_BYTES
    if not gradient_checkpointing:
        return shape.num_layers * layer
    # each layer keeps only its input; backward recomputes one layer's activations at a time
    stored_inputs = shape.num_layers * tokens * shape.hidden_size * ACT_BYTES
    return stored_inputs + CKPT_LIVE_LAYERS * layer


def logits_bytes(shape: ModelShape, micro_batch: int, max_length: int, fused: bool = FUSED_LM_HEAD) -> int:
    """Bytes the LM head and the loss add per GPU."""
    tokens = micro_batch * max_length
    if not fused:
        return shape.vocab_size * tokens * LOGITS_MATERIALIZED_BYTES
    tile = min(tokens, TRL_TOKEN_TILE) * min(shape.vocab_size, TRL_VOCAB_TILE) * TILE_BYTES
    weight_grad = shape.vocab_size * shape.hidden_size * LM_HEAD_GRAD_BYTES
    hidden_grad = tokens * shape.hidden_size * HIDDEN_GRAD_BYTES
    return tile + weight_grad + hidden_grad


def zero_section(option: str, ds_config: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The zero_optimization section of a DeepSpeed config, or the seed's for this option."""
    if ds_config is not None:
        return ds_config.get("zero_optimization", {})
    return SEED_ZERO[option[0]]


def _elements(zero: Mapping[str, Any], key: str, auto: float | None = None) -> int:
    value = zero.get(key, DS_DEFAULTS[key])
    if value == "auto":  # Transformers fills these from hidden_size; DeepSpeed's default otherwise
        value = DS_DEFAULTS[key] if auto is None else auto
    return int(float(value))


def bucket_bytes(option: str, hidden_size: int, zero: Mapping[str, Any]) -> int:
    """Bytes per GPU of DeepSpeed's communication buckets for this option's config."""
    h2 = hidden_size * hidden_size  # Transformers' "auto": reduce h^2, prefetch 0.9 h^2
    reduce = _elements(zero, "reduce_bucket_size", auto=h2)
    stage3 = option.startswith("3")
    overlap = zero.get("overlap_comm", stage3)  # DeepSpeed turns it on by default for stage 3 only
    if stage3:
        prefetch = _elements(zero, "stage3_prefetch_bucket_size", auto=int(0.9 * h2))
        return (reduce + prefetch) * COMM_BYTES * (STAGE3_BUCKET_COPIES if overlap else 1)
    allgather = _elements(zero, "allgather_bucket_size")
    return int((reduce + allgather) * COMM_BYTES * (OVERLAP_COMM_FACTOR if overlap else 1))


def optimizer_step_bytes(option: str, total_params: int, total_gpus: int, zero: Mapping[str, Any]) -> int:
    """Bytes per GPU of the step's transient gradient: fp32 for Adam on the GPU; with the optimizer on the
    CPU, the 16-bit sub-group staged on the GPU before its copy to the host."""
    partition = -(-total_params // total_gpus)
    if option.startswith("3"):  # stage 3 steps one sub-group at a time
        partition = min(partition, _elements(zero, "sub_group_size"))
    if option.endswith(("offload", "offload-all")):
        return OFFLOAD_STAGING_BYTES * partition
    return STEP_FP32_GRAD_BYTES * partition


def busiest_phase(option: str, backward: int, optimizer_step: int) -> int:
    """What the forward/backward adds to the model states, or what the step adds, whichever is more.

    With the optimizer offloaded, gradients leave for the host during the backward: their staging is
    part of it."""
    if option.endswith(("offload", "offload-all")):
        return backward + optimizer_step
    return max(backward, optimizer_step)


def accumulation_bytes(option: str, total_params: int, total_gpus: int, grad_accum: int) -> int:
    """Bytes per GPU of the 16-bit gradient partition ZeRO-1/2 keep between micro-batches."""
    if grad_accum == 1 or option.startswith("3"):
        return 0
    return ACCUMULATION_BYTES * -(-total_params // total_gpus)


def estimate_row(option: str, shape: ModelShape, setup: Setup, ds_config: Mapping[str, Any] | None = None) -> Row:
    """Predict one option's peak per GPU and its host memory, and whether both fit."""
    zero = zero_section(option, ds_config)
    gpu, host = model_states(option, shape.total_params, shape.largest_layer_params, setup.gpus_per_node, setup.nodes)
    terms = {
        "model_states": gpu,
        "activations": activation_bytes(shape, setup.micro_batch, setup.max_length, setup.gradient_checkpointing,
                                        setup.liger_kernels),
        "logits": logits_bytes(shape, setup.micro_batch, setup.max_length),
        "buckets": bucket_bytes(option, shape.hidden_size, zero),
        "optimizer_step": optimizer_step_bytes(option, shape.total_params, setup.total_gpus, zero),
        "accumulation": accumulation_bytes(option, shape.total_params, setup.total_gpus, setup.grad_accum),
    }
    phase = busiest_phase(option, terms["activations"] + terms["logits"] + terms["buckets"], terms["optimizer_step"])
    unmargined = terms["model_states"] + terms["accumulation"] + phase
    margin = int(FRAGMENTATION * unmargined) + int(CUDA_CONTEXT_GIB * GIB)
    peak = unmargined + margin
    fits_gpu = peak <= setup.gpu_budget
    fits_host = None
    if "offload" in option and setup.host_memory_gib is not None:
        fits_host = host <= setup.host_memory_gib * GIB
    why = _why(option, peak, host, fits_gpu, fits_host, setup)
    return Row(option=option, **terms, margin=margin, host=host, fits_gpu=fits_gpu, fits_host=fits_host, why=why)


def _why(option: str, peak: int, host: int, fits_gpu: bool, fits_host: bool | None, setup: Setup) -> str:
    gpu = (f"{_gib(peak):.2f} GiB per GPU of {_gib(setup.gpu_budget):.2f} allowed "
           f"({setup.gpu_memory_gib:g} less {GPU_FREE_FRACTION:.0%} kept free)")
    if fits_host is False:
        verdict = "fits the GPU, " if fits_gpu else "too big for the GPU and the host: "
        return (f"{verdict}{gpu}, but needs {_gib(host):.2f} GiB of host RAM per node (DeepSpeed's estimate), "
                f"{setup.host_memory_gib:g} available")
    why = ("fits: " if fits_gpu else "too big for the GPU: ") + gpu
    if "offload" in option and fits_host is None:
        why += f"; needs {_gib(host):.2f} GiB of host RAM per node; host RAM not given, not checked"
    return why


def choose(rows: tuple[Row, ...], setup: Setup) -> tuple[str | None, str]:
    """The first option in PREFERENCE order that fits, and the reason; (None, why not) if none fits."""
    by_option = {r.option: r for r in rows}
    for option in PREFERENCE:
        r = by_option.get(option)
        if r is not None and r.fits:
            return option, f"{label(option)}, the lowest option that {r.why}"
    gpus = f"{setup.total_gpus} x {setup.gpu_memory_gib:g} GiB"
    host = "" if setup.host_memory_gib is None else f" with {setup.host_memory_gib:g} GiB of host RAM"
    return None, f"nothing fits on {gpus}{host}: " + " | ".join(f"{label(r.option)}: {r.why}" for r in rows)


def label(option: str) -> str:
    """'3-offload' -> 'ZeRO-3-offload', as people write it."""
    return "ZeRO-" + option


def plan_from_shape(shape: ModelShape, gpus_per_node: int, gpu_memory_gib: float, nodes: int = 1,
                    micro_batch: int = 1, max_length: int = 2048, gradient_checkpointing: bool = True,
                    host_memory_gib: float | None = None,
                    ds_configs: Mapping[str, Mapping[str, Any]] | None = None, grad_accum: int = 1,
                    liger_kernels: bool = False) -> Plan:
    """Plan from a ModelShape (raw numbers, no model folder); ds_configs: option -> DeepSpeed config."""
    problems = [f"{name}={value!r}: expected at least 1" for name, value in
                (("gpus_per_node", gpus_per_node), ("nodes", nodes), ("micro_batch", micro_batch),
                 ("max_length", max_length), ("grad_accum", grad_accum)) if value < 1]
    if gpu_memory_gib <= 0:
        problems.append(f"gpu_memory_gib={gpu_memory_gib!r}: expected more than 0")
    if problems:
        raise ValueError("; ".join(problems))
    setup = Setup(gpus_per_node, gpu_memory_gib, nodes, micro_batch, max_length, gradient_checkpointing,
                  host_memory_gib, grad_accum, liger_kernels)
    configs = ds_configs or {}
    rows = tuple(estimate_row(o, shape, setup, configs.get(o)) for o in OPTIONS)
    choice, reason = choose(rows, setup)
    return Plan(shape=shape, setup=setup, rows=rows, choice=choice, reason=reason)


def plan(model: str, gpus_per_node: int, gpu_memory_gib: float, nodes: int = 1, micro_batch: int = 1,
         max_length: int = 2048, gradient_checkpointing: bool = True, host_memory_gib: float | None = None,
         ds_configs: Mapping[str, Mapping[str, Any]] | None = None, grad_accum: int = 1,
         liger_kernels: bool = False) -> Plan:
    """Plan for a model folder or Hub name (reads config.json only)."""
    return plan_from_shape(model_shape(model), gpus_per_node, gpu_memory_gib, nodes, micro_batch, max_length,
                           gradient_checkpointing, host_memory_gib, ds_configs, grad_accum, liger_kernels)


def format_table(p: Plan) -> str:
    """The plan as a table for people."""
    s, m = p.setup, p.shape
    ckpt = "on" if s.gradient_checkpointing else "off"
    host = "not given" if s.host_memory_gib is None else f"{s.host_memory_gib:g} GiB"
    lines = [
        f"{m.name}: {m.total_params:,} parameters, largest layer {m.largest_layer_params:,}",
        (f"{s.nodes} node(s) x {s.gpus_per_node} GPU(s) of {s.gpu_memory_gib:g} GiB "
         f"({_gib(s.gpu_budget):.2f} allowed), host RAM {host}; micro-batch {s.micro_batch} x "
         f"accumulation {s.grad_accum}, {s.max_length} tokens, gradient checkpointing {ckpt}, "
         f"Liger kernels {'on' if s.liger_kernels else 'off'}"),
        "",
        (f"{'GiB per GPU':<19}{'states':>8}{'activ':>8}{'logits':>8}{'buckets':>8}{'step':>7}{'accum':>7}"
         f"{'margin':>8}{'peak':>8}{'host':>9}  fits"),
    ]
    for r in p.rows:
        fits = "yes" if r.fits else "no (host)" if r.fits_gpu else "no"
        lines.append(f"{label(r.option):<19}{_gib(r.model_states):>8.2f}{_gib(r.activations):>8.2f}"
                     f"{_gib(r.logits):>8.2f}{_gib(r.buckets):>8.2f}{_gib(r.optimizer_step):>7.2f}"
                     f"{_gib(r.accumulation):>7.2f}{_gib(r.margin):>8.2f}{_gib(r.peak):>8.2f}"
                     f"{_gib(r.host):>9.2f}  {fits}")
    lines += ["peak: states + accum + the larger of (activ + logits + buckets) and step, + margin",
              "  (offload: step is the gradient staged for the host during the backward, so it adds to it)",
              "host: DeepSpeed's estimate of CPU memory per node; checked against the host for offload only",
              "", f"choice: {label(p.choice) if p.choice else 'none'}", p.reason]
    return "\n".join(lines)
