"""The memory plan: every ZeRO option's predicted peak per GPU for one machine and batch, and whether it fits:
its peak the GPU with GPU_FREE_FRACTION kept free, and its host memory (offload only) the host. It estimates and
chooses nothing: the stage is the decision's (decide.py). The terms are in memory.py."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from .. import stages
from ..stages import Stage
from ..units import GIB, gib
from . import memory
from .shape import ModelShape

GPU_FREE_FRACTION = 0.10  # keep this much of each GPU free: the plan is an estimate
BYTE_FIELDS = ("model_states", "activations", "logits", "buckets", "optimizer_step", "accumulation", "margin",
               "peak", "host", "states_not_made", "mask_build", "head_kept")
LONGEST_ROW_SEARCHED = 4 * 2**20  # tokens: the longest row the plan looks for
LONGEST_ROW_STEP = 1024  # its resolution


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
    liger_kernels: bool = False  # or compiled layers: their activations measured the same (docs/speed.md)
    offload_activations: bool = False  # checkpoints in host memory (with gradient_checkpointing)
    sequence_parallel: int = 1  # GPUs of a node that share each row (DeepSpeed's Ulysses)
    one_pass_step: bool = False  # ZeRO-1/2's step in one pass, with no fp32 gradients (sft/ranks/patches/adamw.py)
    flex_mask_elements: int = 0  # flex attention's mask evaluated at once (memory.flex_mask_elements); 0: other kernels
    head_tiles_kept: bool = True  # the LM head's tiles kept for the backward where there is room (memory.py); False:
    # TRL's own head, which projects them again (every peak measured before they were kept)

    @property
    def row_tokens(self) -> int:
        """The tokens of a row one GPU holds: the whole row, or its 1/N share when N GPUs split it. Activations,
        the LM head's tiles and offloaded checkpoints follow them; the model states do not."""
        return -(-self.max_length // self.sequence_parallel)

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
    peak: int  # states - states_not_made + accumulation + the busier of backward and step + margin
    host: int  # host memory per node: DeepSpeed's estimate for offload, and offloaded checkpoints
    fits_gpu: bool
    fits_host: bool | None  # None: not checked (no offload, or the host's memory was not given)
    why: str
    states_not_made: int = 0  # of model_states (DeepSpeed's estimate): fp32 gradients the one-pass step never makes
    mask_build: int = 0  # flex attention's block mask being built, before the forward: a peak beside the others
    head_kept: int = 0  # of logits: the LM head's tiles kept for the backward (memory.head_tiles_kept)
    step_beside_backward: bool = False  # the step adds to the backward (memory.step_beside_backward), not the larger
    longest_row: int | None = None  # tokens of one row that still fit, this setup otherwise (plan_from_shape)
    longest_row_checkpointed: int | None = None  # the same with checkpointing on, checkpoints on the GPU
    longest_row_offloaded: int | None = None  # ... and with the checkpoints in host memory
    longest_row_split: int | None = None  # ... and each row split over Plan.split GPUs (None: one GPU a node)

    @property
    def fits(self) -> bool:
        """Fits the GPU, and the host where that was checked."""
        return self.fits_gpu and self.fits_host is not False


@dataclass(frozen=True)
class Plan:
    """Every option's row, for one machine and batch."""

    shape: ModelShape
    setup: Setup
    rows: tuple[Row, ...]
    split: int = 1  # the most GPUs of a node a row can be split over here (longest_row_split's)

    def row(self, option: str) -> Row:
        """The row of one option ("1" ... "3-offload-all")."""
        return next(r for r in self.rows if r.option == option)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: sizes in GiB (bytes / 2**30, two decimals, like DeepSpeed)."""
        rows = [{**{k: gib(v) if k in BYTE_FIELDS else v for k, v in asdict(r).items()}, "fits": r.fits}
                for r in self.rows]
        setup = {**asdict(self.setup), "gpu_budget": gib(self.setup.gpu_budget)}
        return {"model": asdict(self.shape), "setup": setup, "options": rows, "split": self.split}

    def to_json(self) -> str:
        """The plan as JSON text (see to_dict)."""
        return json.dumps(self.to_dict(), indent=2)


def estimate_row(stage: Stage, shape: ModelShape, setup: Setup, ds_config: Mapping[str, Any]) -> Row:
    """Predict one option's peak per GPU and its host memory under a DeepSpeed config, and whether both fit."""
    zero = ds_config.get("zero_optimization") or {}
    gpu, host = memory.model_states(stage, shape.total_params, shape.largest_layer_params, setup.gpus_per_node,
                                    setup.nodes)
    terms = {
        "model_states": gpu,
        "activations": memory.activation_bytes(shape, setup.micro_batch, setup.row_tokens,
                                               setup.gradient_checkpointing, setup.liger_kernels,
                                               _offloading(setup)),
        "logits": memory.logits_bytes(shape, setup.micro_batch, setup.row_tokens),
        "buckets": memory.bucket_bytes(stage, shape.hidden_size, zero),
        "optimizer_step": memory.optimizer_step_bytes(stage, shape.total_params, setup.total_gpus, zero,
                                                      setup.one_pass_step),
        "accumulation": memory.accumulation_bytes(stage, shape.total_params, setup.total_gpus, setup.grad_accum),
        "states_not_made": memory.states_not_made(stage, shape.total_params, setup.total_gpus, setup.one_pass_step),
        "mask_build": memory.mask_build_bytes(setup.flex_mask_elements),
    }
    beside = memory.step_beside_backward(stage, setup.one_pass_step, setup.gradient_checkpointing)
    margin, peak = _peak(stage, terms, beside)
    # the LM head's tiles kept for its backward take only what the plan leaves free (memory.head_tiles_kept)
    if setup.head_tiles_kept and peak <= setup.gpu_budget:
        kept = memory.head_tiles_kept(shape, setup.micro_batch, setup.row_tokens,
                                      int(setup.gpu_memory_gib * GIB), setup.gpu_budget - peak - 1)
        if kept:
            terms["logits"] = memory.logits_bytes(shape, setup.micro_batch, setup.row_tokens, kept=kept)
            terms["head_kept"] = kept
            margin, peak = _peak(stage, terms, beside)
    if _offloading(setup):
        host += setup.gpus_per_node * memory.offloaded_activation_bytes(shape, setup.micro_batch, setup.row_tokens)
    fits_gpu = peak <= setup.gpu_budget
    fits_host = None
    if (stage.offload or _offloading(setup)) and setup.host_memory_gib is not None:
        fits_host = host <= setup.host_memory_gib * GIB
    why = _why(stage, peak, host, fits_gpu, fits_host, setup)
    return Row(option=stage.name, **terms, margin=margin, peak=peak, host=host, fits_gpu=fits_gpu,
               fits_host=fits_host, why=why, step_beside_backward=beside)


def _peak(stage: Stage, terms: Mapping[str, int], beside: bool = False) -> tuple[int, int]:
    """(margin, peak): the states less those not made, accumulation, the busiest of the backward, the step (`beside`:
    the two together, memory.step_beside_backward) and the mask's build, then the margin."""
    backward = terms["activations"] + terms["logits"] + terms["buckets"]
    unmargined = (terms["model_states"] - terms["states_not_made"] + terms["accumulation"]
                  + max(memory.busiest_phase(stage, backward, terms["optimizer_step"], beside), terms["mask_build"]))
    margin = memory.margin_bytes(unmargined)
    return margin, unmargined + margin


def _why(stage: Stage, peak: int, host: int, fits_gpu: bool, fits_host: bool | None, setup: Setup) -> str:
    gpu = (f"{gib(peak):.2f} GiB per GPU of {gib(setup.gpu_budget):.2f} allowed "
           f"({setup.gpu_memory_gib:g} less {GPU_FREE_FRACTION:.0%} kept free)")
    if fits_host is False:
        verdict = "fits the GPU, " if fits_gpu else "too big for the GPU and the host: "
        return (f"{verdict}{gpu}, but needs {gib(host):.2f} GiB of host RAM per node (DeepSpeed's estimate), "
                f"{setup.host_memory_gib:g} available")
    why = ("fits: " if fits_gpu else "too big for the GPU: ") + gpu
    if (stage.offload or _offloading(setup)) and fits_host is None:
        why += f"; needs {gib(host):.2f} GiB of host RAM per node; host RAM not given, not checked"
    return why


def _offloading(setup: Setup) -> bool:
    return setup.offload_activations and setup.gradient_checkpointing


def longest_row(stage: Stage, shape: ModelShape, setup: Setup, ds_config: Mapping[str, Any],
                most: int = LONGEST_ROW_SEARCHED) -> int:
    """The most tokens one row may hold and still fit (one row per pass, this setup otherwise); 0: none.
    Bisected, since every term grows with the tokens and none shrinks."""
    def fits(tokens: int) -> bool:
        return estimate_row(stage, shape, replace(setup, micro_batch=1, max_length=tokens), ds_config).fits

    low, high = 0, most
    if fits(high):
        return high
    while high - low > LONGEST_ROW_STEP:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low // LONGEST_ROW_STEP * LONGEST_ROW_STEP


def longest_rows(stage: Stage, shape: ModelShape, setup: Setup, ds_config: Mapping[str, Any],
                 split: int = 1) -> dict[str, int | None]:
    """Row's longest_row fields: this setup's, with checkpointing on, with the checkpoints offloaded, and with
    each row also split over `split` GPUs (where that is more than this setup splits it over)."""
    on = replace(setup, gradient_checkpointing=True, offload_activations=False)
    offloaded = replace(on, offload_activations=True)
    over = replace(offloaded, sequence_parallel=split)
    return {"longest_row": longest_row(stage, shape, setup, ds_config),
            "longest_row_checkpointed": longest_row(stage, shape, on, ds_config),
            "longest_row_offloaded": longest_row(stage, shape, offloaded, ds_config),
            "longest_row_split": longest_row(stage, shape, over, ds_config) if split > setup.sequence_parallel
            else None}


def plan_from_shape(shape: ModelShape, gpus_per_node: int, gpu_memory_gib: float, nodes: int = 1,
                    micro_batch: int = 1, max_length: int = 2048, gradient_checkpointing: bool = True,
                    host_memory_gib: float | None = None,
                    ds_configs: Mapping[str, Mapping[str, Any]] | None = None, grad_accum: int = 1,
                    liger_kernels: bool = False, offload_activations: bool = False,
                    sequence_parallel: int = 1, one_pass_step: bool = False, flex_mask_elements: int = 0,
                    head_tiles_kept: bool = True) -> Plan:
    """Plan from a ModelShape (raw numbers, no model folder); ds_configs: option -> DeepSpeed config
    (default: the shipped ones)."""
    problems = [f"{name}={value!r}: expected at least 1" for name, value in
                (("gpus_per_node", gpus_per_node), ("nodes", nodes), ("micro_batch", micro_batch),
                 ("max_length", max_length), ("grad_accum", grad_accum), ("sequence_parallel", sequence_parallel))
                if value < 1]
    if gpu_memory_gib <= 0:
        problems.append(f"gpu_memory_gib={gpu_memory_gib!r}: expected more than 0")
    if problems:
        raise ValueError("; ".join(problems))
    setup = Setup(gpus_per_node, gpu_memory_gib, nodes, micro_batch, max_length, gradient_checkpointing,
                  host_memory_gib, grad_accum, liger_kernels, offload_activations, sequence_parallel, one_pass_step,
                  flex_mask_elements, head_tiles_kept)
    configs = ds_configs or {}
    split = max(shape.sequence_parallel_degrees(gpus_per_node), default=1)
    rows = []
    for s in stages.TABLE:
        config = configs.get(s.name) or stages.overlap_comm(stages.shipped_config(s.name), s, gpus_per_node * nodes,
                                                           False)[0]
        rows.append(replace(estimate_row(s, shape, setup, config), **longest_rows(s, shape, setup, config, split)))
    return Plan(shape=shape, setup=setup, rows=tuple(rows), split=split)


def _tokens(n: int | None) -> str:
    return "-" if n is None else "none" if n == 0 else f"{n // 1024:,}K" if n >= 1024 else str(n)


def format_table(p: Plan) -> str:
    """The plan as tables for people: memory per option, then the longest row each way of keeping it."""
    s, m = p.setup, p.shape
    ckpt = ("offload" if _offloading(s) else "on") if s.gradient_checkpointing else "off"
    host = "not given" if s.host_memory_gib is None else f"{s.host_memory_gib:g} GiB"
    split = f", each row split over {s.sequence_parallel} GPUs" if s.sequence_parallel > 1 else ""
    lines = [
        f"{m.name}: {m.total_params:,} parameters, largest layer {m.largest_layer_params:,}",
        (f"{s.nodes} node(s) x {s.gpus_per_node} GPU(s) of {s.gpu_memory_gib:g} GiB "
         f"({gib(s.gpu_budget):.2f} allowed), host RAM {host}; micro-batch {s.micro_batch} x "
         f"accumulation {s.grad_accum}, {s.max_length} tokens{split}, gradient checkpointing {ckpt}, "
         f"Liger kernels or compiled layers {'on' if s.liger_kernels else 'off'}"),
        "",
        (f"{'GiB per GPU':<19}{'states':>8}{'activ':>8}{'logits':>8}{'buckets':>8}{'step':>7}{'accum':>7}"
         f"{'margin':>8}{'peak':>8}{'host':>9}  fits"),
    ]
    for r in p.rows:
        fits = "yes" if r.fits else "no (host)" if r.fits_gpu else "no"
        lines.append(f"{stages.get(r.option).label:<19}{gib(r.model_states):>8.2f}{gib(r.activations):>8.2f}"
                     f"{gib(r.logits):>8.2f}{gib(r.buckets):>8.2f}{gib(r.optimizer_step):>7.2f}"
                     f"{gib(r.accumulation):>7.2f}{gib(r.margin):>8.2f}{gib(r.peak):>8.2f}"
                     f"{gib(r.host):>9.2f}  {fits}")
    not_made = max((r.states_not_made for r in p.rows), default=0)
    mask = max((r.mask_build for r in p.rows), default=0)
    kept = max((r.head_kept for r in p.rows), default=0)
    lines += ["peak: states + accum + the larger of (activ + logits + buckets) and step"
              + (f" and flex attention's mask being built ({gib(mask):.2f})" if mask else "") + ", + margin"
              + (f"; ZeRO-1/2 less {gib(not_made):.2f} GiB of states: their step makes no fp32 gradients" if not_made
                 else ""),
              "  (offload: step is the gradient staged for the host during the backward, so it adds to it)",
              *(["  (ZeRO-1/2 with checkpointing: the step's flattened gradients need a block beside the backward's "
                 "memory, so they add to it)"] if any(r.step_beside_backward for r in p.rows) else []),
              *([f"logits: up to {gib(kept):.2f} GiB of it the LM head's tiles kept for its backward, where the "
                 "option has room"] if kept else []),
              "host: CPU memory per node (DeepSpeed's estimate; offloaded checkpoints); checked for offload only",
              "", *_longest_rows_table(p)]
    return "\n".join(lines)


def _longest_rows_table(p: Plan) -> list[str]:
    split = any(r.longest_row_split is not None for r in p.rows)
    heads = ["as planned", "ckpt on GPU", "ckpt in host"] + ([f"split over {p.split}"] if split else [])
    lines = [f"{'longest row, tokens':<19}" + "".join(f"{h:>15}" for h in heads)]
    for r in p.rows:
        values = [r.longest_row, r.longest_row_checkpointed, r.longest_row_offloaded]
        values += [r.longest_row_split] if split else []
        shown = [_tokens(v) + ("+" if v == LONGEST_ROW_SEARCHED else "") for v in values]  # + : the search's cap
        lines.append(f"{stages.get(r.option).label:<19}" + "".join(f"{v:>15}" for v in shown))
    lines.append("longest row: the most tokens one row may hold that still fit; as planned: checkpointing as above"
                 + (f"; split: checkpoints in host and each row over {p.split} GPUs of a node "
                    "(SFT_SEQUENCE_PARALLEL)" if split else ""))
    return lines
