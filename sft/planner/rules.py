"""The decision's rules, each a pure function of settings and facts that returns its choice and the reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .. import exitcodes
from ..handoff import CheckpointRecord, Split
from ..settings import Settings
from ..settings.checks import sequence_parallel_problems
from ..stages import Stage
from ..units import GIB
from .inputs import CannotRun, Inputs, Machine, Ranks
from .shape import ModelShape

BATCH_SEARCH_TRIES = 3  # splits timed at most: each loads the model once more


def choose_ranks(s: Settings, machine: Machine) -> Ranks:
    """One rank per selected GPU; on a machine with no GPU, SFT_CPU_RANKS ranks on CPU (raises CannotRun). Chosen
    once a start, before the data is read (it counts the rows a step takes), and carried in the Inputs."""
    visible = len(machine.gpus)
    if visible == 0:
        ignored = f"; SFT_GPUS={s.gpus} ignored: this machine has no GPU" if s.gpus != "all" else ""
        return Ranks(s.cpu_ranks, (), machine.nodes, f"{s.cpu_ranks} CPU rank(s) on gloo (SFT_CPU_RANKS){ignored}")
    if s.gpus == "all":
        return Ranks(visible, tuple(range(visible)), machine.nodes, f"every GPU this process sees ({visible})")
    chosen = tuple(int(g) for g in s.gpus.split(","))
    missing = [g for g in chosen if g >= visible]
    if missing:
        raise CannotRun(f"SFT_GPUS={s.gpus!r}: this machine shows {visible} GPU(s) (0-{visible - 1}); no GPU "
                        f"{', '.join(map(str, missing))}", exitcodes.BAD_SETTINGS)
    return Ranks(len(chosen), chosen, machine.nodes, f"GPUs {s.gpus} (SFT_GPUS)")


def probe_goes_on(s: Settings, ranks: Ranks, record: CheckpointRecord | None) -> tuple[bool, str | None]:
    """Whether the probe is the training's own launch, which goes on after the probe's steps unless its figures
    change the decision (an escalation, the budget's cap or refusal); the reason (None: no probe runs). A probe
    launched apart loads and compiles the model again for the training, and throws its steps away: minutes of
    a one-epoch run (measured: docs/speed.md, 'where a one-epoch run's time goes')."""
    if s.probe_steps == 0 or record is not None:
        return False, None
    n = s.probe_steps
    if ranks.nodes > 1:
        return False, f"launched apart: on {ranks.nodes} nodes the ranks elsewhere cannot read node 0's verdict"
    if s.save_steps is not None and s.save_steps <= n:  # by time, the ranks save nothing before the verdict
        return False, (f"launched apart: a checkpoint (SFT_SAVE_STEPS={s.save_steps}) would be saved before the "
                       f"verdict on its {n} steps (SFT_PROBE_STEPS)")
    if 0 < s.max_steps <= n:
        return False, f"launched apart: the run (SFT_MAX_STEPS={s.max_steps}) is no longer than it ({n} steps)"
    return True, (f"the training's own launch: its first {n} steps (SFT_PROBE_STEPS) are timed, and it goes on "
                  "from there unless their figures change the decision")


def precision(s: Settings, ranks: Ranks) -> tuple[bool, str]:
    """bf16 (True) or fp32; bf16 needs GPUs: the Trainer refuses it on CPU ranks (raises CannotRun)."""
    if s.precision == "bf16" and not ranks.on_gpu:
        raise CannotRun("SFT_PRECISION='bf16': this machine has no GPU, and the Trainer trains in bf16 on GPUs "
                        "only: use fp32, or auto (fp32 on CPU)", exitcodes.BAD_SETTINGS)
    bf16 = s.precision == "bf16" or (s.precision == "auto" and ranks.on_gpu)
    return bf16, ("bf16" if bf16 else "fp32") + (" (SFT_PRECISION)" if s.precision != "auto" else
                                                 ", auto: bf16 on GPUs, fp32 on CPU")


# FlashAttention-4's CuTe kernels exist for Hopper (sm90) and Blackwell (sm100, sm120); measured on Hopper only
FLASH_ATTENTION_4_CAPABILITY = (9, 0)
# The longest rows auto gives FlashAttention-4 (compiled layers): it trained faster than compiled flex attention at rows
# of 2,048 and 8,192 tokens, slower at 16,384 and 65,536 (measured: docs/speed.md,
# 'FlashAttention-4 is auto for compiled layers'; 'FlashAttention-4 +9% and +10% (opt-in)').
FLASH_ATTENTION_4_MAX_LENGTH = 8192


def check_attention(s: Settings, ranks: Ranks, machine: Machine, shape: ModelShape) -> None:
    """SFT_ATTENTION set to a kernel that cannot run here or that the model's class lacks: refused (CannotRun) with
    what would be right, before any rank loads the model (transformers refuses it there, in every rank)."""
    if s.attention == "flash_attention_4" and (where := flash_attention_4_missing(ranks, machine)):
        raise CannotRun(f"SFT_ATTENTION='flash_attention_4': {where}; FlashAttention-4 runs on GPUs of compute "
                        "capability 9.0 or newer (H100, H200, B200) with flash-attn-4 installed (the image has "
                        "it): use auto", exitcodes.BAD_SETTINGS)
    if s.attention != "auto" and not shape.runs(s.attention):
        raise CannotRun(f"SFT_ATTENTION={s.attention!r}: {shape.class_name} (SFT_MODEL) has no {s.attention} in "
                        f"transformers; it runs {', '.join(shape.attentions)}: use one of those, or auto",
                        exitcodes.BAD_SETTINGS)


def flash_attention_4_missing(ranks: Ranks, machine: Machine) -> str:
    """What FlashAttention-4 lacks on these ranks ("": nothing): asked for, a refusal; under auto, flex's reason."""
    old = [g.name for i, g in enumerate(machine.gpus)
           if i in ranks.gpus and g.capability < FLASH_ATTENTION_4_CAPABILITY]
    return ("this machine has no GPU" if not ranks.on_gpu else
            f"{', '.join(sorted(set(old)))} is older than compute capability 9.0" if old else
            "flash-attn-4 is not installed here" if not machine.flash_attention_4_installed else
            f"flash-attn-4 is installed but does not import ({machine.flash_attention_4_broken})"
            if machine.flash_attention_4_broken else "")


def attention(s: Settings, ranks: Ranks, machine: Machine, shape: ModelShape, split: int = 1,
              compiled: bool = False) -> tuple[str, str]:
    """The attention kernel, for layers compiled or not (check_attention has refused what cannot run); under auto,
    the next one the model's class runs where it lacks the first choice."""
    kernel, why = _preferred_attention(s, ranks, machine, split, compiled)
    if shape.runs(kernel):
        return kernel, why
    if split > 1:
        raise CannotRun(f"rows split over {split} GPUs: DeepSpeed's Ulysses wraps sdpa, which "
                        f"{shape.class_name} lacks in transformers: leave SFT_SEQUENCE_PARALLEL at 1",
                        exitcodes.BAD_SETTINGS)
    # each keeps packed sequences apart as FlashAttention-4 does; flex only on GPUs (no fast CPU kernel)
    order = ("flex_attention", "sdpa", "eager") if ranks.on_gpu else ("sdpa", "eager")
    fallback = next(k for k in order if shape.runs(k))
    return fallback, f"{fallback}, auto: {shape.class_name} has no {kernel} in transformers (first: {why})"


def _preferred_attention(s: Settings, ranks: Ranks, machine: Machine, split: int, compiled: bool) -> tuple[str, str]:
    """The kernel auto prefers on these ranks, whatever the model."""
    if s.attention != "auto":
        return s.attention, f"{s.attention} (SFT_ATTENTION)"
    if split > 1:
        return "sdpa", "sdpa, auto with rows split over GPUs: DeepSpeed's Ulysses wraps sdpa, not flex attention"
    if not ranks.on_gpu:
        return "sdpa", "sdpa, auto on CPU: flex attention has no fast CPU kernel"
    too_long = (f"rows of {s.max_length:,} tokens, longer than the {FLASH_ATTENTION_4_MAX_LENGTH:,} where it was "
                "measured faster" if s.max_length > FLASH_ATTENTION_4_MAX_LENGTH else "")
    why_not = ("the layers are not compiled (uncompiled, FlashAttention-4 trained at half the speed)" if not compiled
               else flash_attention_4_missing(ranks, machine) or too_long)
    if not why_not:
        return "flash_attention_4", (
            "flash_attention_4, auto: compiled layers on GPUs of compute capability 9.0+ with flash-attn-4, rows "
            f"up to {FLASH_ATTENTION_4_MAX_LENGTH:,} tokens (each packed sequence attends to itself; on an H200 "
            "9-10% faster than compiled flex attention, the same loss; its kernels compile at the first step and "
            "are cached in the output folder)")
    return "flex_attention", ("flex_attention, auto on GPUs: its block mask skips the other sequences of a packed "
                              f"row (not FlashAttention-4: {why_not})")


def batch_split(s: Settings, record: CheckpointRecord | None, on_gpu: bool,
                split: int = 1) -> tuple[Split, bool, str]:
    """(the split, whether a batch search chose it, why). Rows per step follow SFT_TOKENS_PER_STEP at this
    SFT_MAX_LENGTH unless SFT_MICRO_BATCH says; checkpointing as the setting says (auto: on, decided later).
    With rows split over `split` GPUs the rows are those of each data-parallel group (the N GPUs sharing
    them), as micro-batch and accumulation are the Trainer's per data-parallel rank."""
    if record is not None and record.batch is not None:
        return record.batch, True, (f"{record.batch.text()}, as the checkpoint resumed records it (its batch "
                                    "search's, or its rows per step kept on another number of ranks)")
    ckpt, offload = s.gradient_checkpointing != "false", s.gradient_checkpointing == "offload" and on_gpu
    rows = max(1, s.tokens_per_step // s.max_length)
    per = "GPU" if split == 1 else f"group of {split} GPUs"
    tokens = f"{rows} row(s) of {s.max_length} tokens, {rows * s.max_length:,} tokens per {per} per step"
    if s.micro_batch is not None:
        accum = s.grad_accum or 1
        return Split(s.micro_batch, accum, ckpt, offload), False, (
            f"{s.micro_batch} x {accum}: SFT_MICRO_BATCH" + (" x SFT_GRAD_ACCUM" if s.grad_accum else ""))
    if s.grad_accum is not None:
        micro = max(1, rows // s.grad_accum)
        return Split(micro, s.grad_accum, ckpt, offload), False, (
            f"{micro} x {s.grad_accum}: SFT_GRAD_ACCUM, and SFT_TOKENS_PER_STEP={s.tokens_per_step} at "
            f"{s.max_length} tokens a row")
    return Split(rows, 1, ckpt, offload), False, f"{rows} x 1: {tokens} (SFT_TOKENS_PER_STEP)"


def levels(s: Settings, split: Split, on_gpu: bool) -> tuple[Split, ...]:
    """The ways of keeping activations the setting allows, cheapest first: checkpoints on the GPU, then in
    host memory (auto, on GPUs: CPU ranks have no GPU memory to save); the setting's own otherwise.
    (auto's "off" is tried once a stage is chosen.)"""
    on = replace(split, gradient_checkpointing=True, offload_activations=False)
    offload = replace(split, gradient_checkpointing=True, offload_activations=on_gpu)
    return {"auto": (on, offload) if on_gpu else (on,), "true": (on,), "offload": (offload,),
            "false": (replace(split, gradient_checkpointing=False, offload_activations=False),)}[
        s.gradient_checkpointing]


# auto writes checkpoints in the background where their snapshot takes at most this share of the host's memory
# left after offload's own: the rest is the ranks' processes, the page cache the writes go through, the data
SNAPSHOT_HOST_SHARE = 0.6


def save_background(s: Settings, m: Machine, ranks: Ranks, snapshot_bytes: int | None,
                    offload_bytes: int | None) -> tuple[bool, str]:
    """Whether checkpoints are written while the steps go on (ranks/patches/background.py): their snapshot is one
    checkpoint's size on each node, in host memory kept for it."""
    if s.save_background != "auto":
        return s.save_background == "true", f"{s.save_background} (SFT_SAVE_BACKGROUND)"
    if snapshot_bytes is None or m.host_memory_bytes is None:
        return False, "off, auto: the host's memory or the checkpoint's size is not known here"
    room = (m.host_memory_bytes - (offload_bytes or 0)) * SNAPSHOT_HOST_SHARE
    shown = f"a checkpoint's snapshot takes {snapshot_bytes / GIB:.3g} GiB of host memory per node"
    if snapshot_bytes > room:
        return False, (f"off, auto: {shown}, over {SNAPSHOT_HOST_SHARE:.0%} of the {room / SNAPSHOT_HOST_SHARE / GIB:.1f}"
                       " GiB left to it; the steps wait for each save (SFT_SAVE_BACKGROUND=true writes in the "
                       "background anyway)")
    return True, f"on, auto: {shown}, and the steps wait only for that copy, not for the files"


def compile_model(s: Settings, ranks: Ranks, stage: Stage, sequence_parallel: int = 1) -> tuple[bool, str]:
    """Whether each decoder layer is compiled (sft/ranks/train.py::regional_compilation), at this stage. Compiled,
    Liger's kernels stay off (liger below), and the planner counts a compiled layer's activations as Liger's (measured
    the same)."""
    if s.compile != "auto":
        return s.compile == "true", f"{s.compile} (SFT_COMPILE)"
    if not ranks.on_gpu:
        return False, "off, auto on CPU: compiling would take longer than a CPU run trains"
    if s.liger_kernels == "true":
        return False, "off, auto: SFT_LIGER_KERNELS=true, and compiled with Liger's kernels the loss was NaN"
    if stage.zero not in (1, 2) or stage.offload:
        return False, (f"off, auto with {stage.label}: measured compiled only with ZeRO-1 and 2 (parameters whole "
                       "on each GPU); SFT_COMPILE=true compiles anyway")
    if sequence_parallel > 1:
        return False, ("off, auto with rows split over GPUs: DeepSpeed's Ulysses attention was not measured "
                       "compiled; SFT_COMPILE=true compiles anyway")
    # Compiled without Liger's kernels: the same peak and losses as uncompiled with them (measured: docs/speed.md,
    # 'each decoder layer compiled, Liger's kernels off'). Compiled with Liger's kernels the loss was NaN
    # (docs/speed.md, 'Liger's kernels under torch.compile make the NaN'), so compiling turns them off.
    return True, ("on, auto on GPUs with ZeRO-1 and 2: each decoder layer compiled once, Liger's kernels off "
                  "(an H200 trained 18% faster so: 15,172 against 12,882 tokens/s, the same loss); its first "
                  "steps compile, and the probe counts them")


def sequence_parallel(s: Settings, ranks: Ranks, shape: ModelShape,
                      record: CheckpointRecord | None) -> tuple[tuple[int, ...], str]:
    """Over how many GPUs of a node each row may be split (DeepSpeed's Ulysses), as the numbers to plan in order,
    the first that fits taken; and why (raises CannotRun). Splitting a row divides what grows with its tokens
    (activations, the LM head's tiles, checkpoints) by N and leaves the model states as they are, at the cost
    of two all-to-alls per layer and world / N data-parallel groups. So auto splits only where one GPU cannot
    hold a row: 1, then each N that splits the model's heads and the node, fewest first (on GPUs only: CPU
    ranks split when asked). A resume keeps the checkpoint's: N decides which rows each step reads."""
    asked = s.sequence_parallel
    if record is not None and asked in ("auto", record.sequence_parallel):
        if record.sequence_parallel > 1 and record.world_size != ranks.world:  # resharded: the new ranks split it
            check_split(record.sequence_parallel, ranks, shape)
        return (record.sequence_parallel,), f"{record.sequence_parallel}, as the checkpoint resumed was written"
    if record is not None:
        raise CannotRun(
            f"SFT_SEQUENCE_PARALLEL='{asked}': the checkpoint to resume split each row over {record.sequence_parallel} "
            f"ranks, and N sets which rows each step reads (world / N data-parallel groups), so another N would "
            f"repeat or skip rows: set SFT_SEQUENCE_PARALLEL={record.sequence_parallel} or auto", exitcodes.PREFLIGHT)
    if asked != "auto":
        if problems := sequence_parallel_problems(s):
            raise CannotRun("; ".join(problems), exitcodes.BAD_SETTINGS)
        if asked > 1:
            check_split(asked, ranks, shape)
        groups = (f": each {'GPU' if ranks.on_gpu else 'rank'} holds 1/{asked} of each row, {ranks.world // asked} "
                  "data-parallel group(s)")
        return (asked,), f"{asked} (SFT_SEQUENCE_PARALLEL)" + (groups if asked > 1 else "")
    degrees = tuple(n for n in shape.sequence_parallel_degrees(ranks.count) if s.max_length % n == 0)
    if (blocked := _why_whole(s, ranks, shape, degrees)) is not None:
        return (1,), f"1, auto: {blocked}"
    return (1, *degrees), "auto: the fewest GPUs that hold a row"


def _why_whole(s: Settings, ranks: Ranks, shape: ModelShape, degrees: tuple[int, ...]) -> str | None:
    """Why auto keeps each row on one GPU whatever its length; None: it may split."""
    if not ranks.on_gpu:
        return "on CPU: CPU ranks split rows only when SFT_SEQUENCE_PARALLEL asks"
    if ranks.count == 1:
        return "one GPU per node"
    if not degrees:
        return (f"the model's {shape.num_heads} attention heads ({shape.num_kv_heads} key/value) and "
                f"SFT_MAX_LENGTH={s.max_length} split over no number of this node's {ranks.count} GPUs")
    if s.packing:
        return "SFT_PACKING=true: a split row needs SFT_PACKING=false"
    if s.attention not in ("auto", "sdpa"):
        return f"SFT_ATTENTION={s.attention}: a split row needs sdpa"
    return None


def check_split(n: int, ranks: Ranks, shape: ModelShape) -> None:
    """N GPUs sharing a row are GPUs of one node, and take an equal share of the model's heads (raises CannotRun)."""
    problems = [f"{n} does not divide the {ranks.count} rank(s) of a node (each row's GPUs are on one node)"
                if ranks.count % n else "",
                # torch.distributed.nn's all_gather, which sums the loss over a row's ranks, emulates its
                # backward's reduce-scatter on gloo with scatters from group ranks taken for global ones
                # (torch 2.13): right only for the group of ranks 0..N-1
                f"CPU ranks (gloo) split rows only over all of them: set it to SFT_CPU_RANKS={ranks.world}"
                if not ranks.on_gpu and n != ranks.world and not ranks.count % n else "",
                f"the model's {shape.num_heads} attention heads ({shape.num_kv_heads} key/value) do not split over "
                f"{n} GPUs" if not shape.splits_heads(n) else ""]
    if any(problems):
        raise CannotRun(f"SFT_SEQUENCE_PARALLEL='{n}': " + "; ".join(p for p in problems if p) + " (splits that fit "
                        f"here: {', '.join(map(str, shape.sequence_parallel_degrees(ranks.count))) or 'none'})",
                        exitcodes.BAD_SETTINGS)


def liger(s: Settings, ranks: Ranks, machine: Machine, compiled: bool) -> tuple[bool, str]:
    if s.liger_kernels != "auto":  # true with SFT_COMPILE=true is refused (sft/settings/checks.py)
        return s.liger_kernels == "true", f"{s.liger_kernels} (SFT_LIGER_KERNELS)"
    if compiled:
        return False, "off, auto: the model's layers are compiled, and compiled with Liger's kernels the loss was NaN"
    if not ranks.on_gpu:
        return False, "off, auto on CPU: Liger's kernels are Triton, GPU only"
    if not machine.liger_installed:
        return False, "off, auto: liger-kernel or Triton is not installed"
    return True, "on, auto on GPUs with liger-kernel installed (less activation memory, fused kernels)"


def stage_source(inputs: Inputs) -> str | None:
    """Who fixed the stage (a user's file, a checkpoint, SFT_ZERO_STAGE); None: auto picks it."""
    s = inputs.settings
    if inputs.user_config is not None:
        return "SFT_DS_CONFIG"
    if inputs.record is not None:
        return "the checkpoint resumed"
    return None if s.zero_stage == "auto" else "SFT_ZERO_STAGE"


def pin_memory_rule(memlock_bytes: int | None, offload: bool | None, pinned_bytes: int | None) -> tuple[bool, str]:
    """Whether offload may pin host memory, which counts against `ulimit -l` (None: unlimited); offload
    None: not known yet (`doctor` without a model)."""
    if memlock_bytes is None:
        return True, "ulimit -l unlimited: pinned memory allowed"
    shown = f"ulimit -l is {memlock_bytes // 1024} KiB"
    if offload is False:
        return True, f"{shown}: no offload, nothing large is pinned"
    if pinned_bytes is not None and memlock_bytes >= pinned_bytes:
        return True, f"{shown}: enough for {pinned_bytes / GIB:.1f} GiB pinned"
    need = f" (about {pinned_bytes / GIB:.1f} GiB here)" if pinned_bytes else ""
    return False, (f"{shown}: offload pins the optimizer state in host memory{need}, which counts against it, so "
                   "pin_memory will be turned off (slower host-GPU copies). To keep it: docker run --ulimit memlock=-1")


def batch_candidates(rows: int, checkpointing: tuple[bool, ...], fits: Callable[[int, bool], bool],
                     every: bool, offload: bool = False) -> list[Split]:
    """Splits of `rows` per step worth timing, most rows per pass first, at most BATCH_SEARCH_TRIES. Each
    micro-batch comes with the first checkpointing choice that `fits` (the planner) allows, off before
    on: at the same micro-batch, recomputing only costs time.

    every=False (SFT_BATCH_SEARCH=auto): only the splits that can be the fastest. At the same
    checkpointing more rows per pass measured faster every time (docs/speed.md), so of each
    checkpointing choice only its largest micro-batch is kept; what is left to time is a larger
    micro-batch with checkpointing against a smaller one without, which no memory rule decides.
    every=True: each split that fits. offload: checkpoints, where on, are kept in host memory."""
    found: list[Split] = []
    for mb in (m for m in range(rows, 0, -1) if rows % m == 0):
        choice = next((c for c in checkpointing if fits(mb, c)), None)
        if choice is None or (not every and any(f.gradient_checkpointing == choice for f in found)):
            continue
        found.append(Split(mb, rows // mb, choice, choice and offload))
    return found[:BATCH_SEARCH_TRIES]
