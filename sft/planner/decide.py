"""Every choice the job makes, in one pure step: settings + machine + checkpoint -> one frozen Decision.

    decide(inputs)            at start: ranks, precision, Liger, over how many GPUs each row is split, stage,
                              checkpointing, attention, the batch split and which splits to time,
                              pin_memory, launcher, whether the probe's launch goes on as the training;
                              a reason each; on another number of ranks than the
                              checkpoint's, its conversion (reshard.py)
    adopt(inputs, d, split)   after the batch search: the split it measured fastest
    escalation.escalate       after the probe ran out of memory: checkpointing on (timed), the next stage
    cap_steps(d, n, why)      after the budget gate (planner/budget.py): train only the n steps that fit

Nothing here reads a file, the clock or the machine: the controller measures (controller/machine.py),
decides here, then carries the Decision out; tests/test_decide.py is a table of cases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import exitcodes, stages
from ..handoff import Split
from ..stages import Stage
from ..units import GIB
from . import data as data_rules
from . import disk, memory, optimizer, reshard, rules
from .decision import Decision
from .inputs import CannotRun, Inputs, Machine, Ranks
from .plan import GPU_FREE_FRACTION, Plan, Row, Setup, estimate_row, longest_rows, plan_from_shape
from .reshard import Reshard

CPU_RANK_MEMORY_GIB = 16.0  # what a CPU rank is planned with when the host's memory is unknown


def decide(inputs: Inputs) -> Decision:
    """The decision at start (raises CannotRun)."""
    s, record = inputs.settings, inputs.record
    ranks = inputs.ranks
    reasons = {"ranks": ranks.why}
    bf16, reasons["precision"] = rules.precision(s, ranks)
    splits, why_split = rules.sequence_parallel(s, ranks, inputs.shape, record)
    rules.check_attention(s, ranks, inputs.machine, inputs.shape)
    # a draft: _first_stage plans with its ranks and split, _at_stage compiles or not, Liger and the attention
    # kernel for each stage it tries; _with_stage fills the rest
    draft = Decision(ranks=ranks, bf16=bf16, attention="", liger=False, compile=False, stage=stages.get("1"),
                     ds_config={}, split=None, searched=False, search=(), pin_memory=True,  # type: ignore[arg-type]
                     launcher=s.launcher, plan=None, row=None, reasons=reasons)  # type: ignore[arg-type]
    d = _split_rows(inputs, draft, splits, why_split)
    if s.gradient_checkpointing == "auto" and not d.searched:
        d = _auto_checkpointing(inputs, d)
    elif not d.searched:
        why = f"{d.split.checkpointing_text} (SFT_GRADIENT_CHECKPOINTING)"
        d = _replace(d, reasons={**d.reasons, "gradient_checkpointing": why})
    d = _with_search(inputs, d)
    if d.reshard is not None:  # this start loads the converted checkpoint; its own checkpoints are ordinary ones
        d = _replace(d, ds_config=reshard.universal_load(d.ds_config),
                     reasons={**d.reasons, "reshard": reshard.with_fit(d.reasons["reshard"], d.row, d.stage)})
    if record is not None and record.max_steps is not None:
        d = cap_steps(d, record.max_steps, "as the budget capped them for the checkpoint resumed")
    d = _replace(d, reasons={**d.reasons, "launcher": f"{s.launcher} (SFT_LAUNCHER)"})
    d = _saved_in_background(inputs, d)
    goes_on, why_probe = rules.probe_goes_on(s, ranks, record)
    if why_probe:
        d = _replace(d, probe_goes_on=goes_on, reasons={**d.reasons, "probe": why_probe})
    return _with_data(inputs, d)


def _saved_in_background(inputs: Inputs, d: Decision) -> Decision:
    """Whether checkpoints are written while the steps go on, from what their snapshot takes of the host."""
    snapshot = disk.snapshot_bytes(inputs.shape.total_params, d.bf16, d.stage.zero,
                                    disk.optimizer_of(d.ds_config, inputs.settings.extra_trainer_args, d.stage),
                                    d.ranks.nodes)
    on, why = rules.save_background(inputs.settings, inputs.machine, d.ranks, snapshot,
                                    d.row.host if d.offload else None)
    return _replace(d, save_background=on, snapshot_bytes=(snapshot or 0) if on else 0,
                    reasons={**d.reasons, "save_background": why})


def _with_data(inputs: Inputs, d: Decision) -> Decision:
    """The model's commit and the data plan: which rows, which tokens carry the loss, the evaluation."""
    reasons = dict(d.reasons)
    if inputs.model_revision:
        asked = inputs.settings.model_revision
        reasons["model"] = f"{inputs.settings.model} at commit {inputs.model_revision}" + (
            f" (SFT_MODEL_REVISION={asked})" if asked else " (its main branch at start)")
    if inputs.settings.trust_remote_code:
        reasons["remote_code"] = ("SFT_TRUST_REMOTE_CODE=true: the model's own code runs in the controller and every "
                                  f"rank, trusted on purpose ({'; '.join(inputs.remote_code)})" if inputs.remote_code
                                  else "SFT_TRUST_REMOTE_CODE=true, and the model maps no class to code of its own: "
                                  "none runs")
    if inputs.data is None:
        return _replace(d, model_revision=inputs.model_revision, reasons=reasons)
    plan, why = data_rules.plan(inputs.settings, inputs.data)
    return _replace(d, data=plan, model_revision=inputs.model_revision, reasons={**reasons, **why})


def _split_rows(inputs: Inputs, draft: Decision, splits: tuple[int, ...], why: str) -> Decision:
    """The draft with its rows split over the first number of GPUs in `splits` at which a stage fits (the last
    one, if none does: with an explicit stage the probe decides), its batch split and its stage."""
    s = inputs.settings
    for n in splits:
        split, searched, why_rows = _batch_split(inputs, draft.ranks, n)
        d = _replace(draft, split=split.after if isinstance(split, Reshard) else split, searched=searched,
                     sequence_parallel=n, reshard=split if isinstance(split, Reshard) else None,
                     reasons={**draft.reasons, **why_rows})
        try:
            d = with_stage(inputs, d, *_first_stage(inputs, d))
        except CannotRun as e:
            if n == splits[-1]:
                split_why = why if len(splits) == 1 else f"{why}, and none of {', '.join(map(str, splits))} fits"
                raise CannotRun(f"{e} (rows split over GPUs: {split_why})", e.exit_code, e.plan) from None
            continue
        if d.row.fits or n == splits[-1]:
            break
    if len(splits) > 1:  # auto chose among several
        why = (f"{n}, auto: a row of {s.max_length:,} tokens fits on one GPU" if n == 1 else
               f"{n}, auto: one GPU cannot hold a row of {s.max_length:,} tokens; split over {n}, each holds "
               f"{d.plan.setup.row_tokens:,} ({d.ranks.world // n} data-parallel group(s))")
    return _replace(d, reasons={**d.reasons, "sequence_parallel": why})


def _batch_split(inputs: Inputs, ranks: Ranks, n: int) -> tuple[Split | Reshard, bool, dict[str, str]]:
    """Each rank's split with rows split over n GPUs, and the reasons; on another number of ranks than the
    checkpoint's, the conversion that keeps its rows per step (its `after` is the split)."""
    record = inputs.record
    split, searched, why = rules.batch_split(inputs.settings, record, ranks.on_gpu, n)
    if record is None or record.world_size == ranks.world:
        return split, searched, {"split": why}
    moved, why_moved = reshard.plan(record, ranks.world, split, n)
    after = moved.after
    why = (f"{after.micro_batch} x {after.grad_accum} on each of {reshard.groups(ranks.world, n)}: the checkpoint's "
           f"{moved.rows} rows per step")
    return moved, searched, {"split": why, "reshard": why_moved}


def _first_stage(inputs: Inputs, d: Decision) -> tuple[Stage, Mapping[str, Any], str, Split]:
    """The stage (and how checkpoints are kept) of a first start: the user's, the checkpoint's, or the
    first in stages.preference that fits, its checkpoints on the GPU if they fit, else in host memory."""
    source = rules.stage_source(inputs)
    allows = optimizer.optimizer_choice(inputs.settings)
    if inputs.user_config is not None:
        stage = stages.of_config(inputs.user_config, allows)
        config, why = inputs.user_config, f"{stage.label}, as your DeepSpeed file says (SFT_DS_CONFIG)"
    elif source is not None:
        name = inputs.record.stage if inputs.record is not None else stages.named(inputs.settings.zero_stage,
                                                                                  allows)
        stage, config, why = stages.get(name), stages.shipped_config(name), f"{stages.get(name).label} ({source})"
    else:
        for name in (n for n in stages.preference(d.ranks.world) if stages.allowed(n, allows)):
            stage, config = stages.get(name), stages.shipped_config(name)
            at = _at_stage(inputs, d, stage, config)
            if (split := _fitting_level(inputs, at)) is not None:  # its figure the table's: the plan of `at`
                p = _plan(inputs, at, split)
                why = f"auto: {stage.label}, the lowest option that {p.row(name).why}"
                if stage.eight_bit and allows == "auto":
                    why += f"; {optimizer.full_precision_does_not_fit(p)}"
                return stage, config, why, split
        p = _plan(inputs, d, _levels(inputs, d)[-1])
        raise CannotRun(f"no ZeRO option fits this machine: {none_fits(p, allows)}; {needs(p, allows)}",
                        exitcodes.PREFLIGHT, p)
    at = _at_stage(inputs, d, stage, config)
    return stage, config, why, _fitting_level(inputs, at) or _levels(inputs, d)[-1]


def none_fits(p: Plan, allows: str = "auto") -> str:
    """Why no option of the plan that SFT_OPTIMIZER allows can run: each one's reason; and the option it does not
    allow that would."""
    s = p.setup
    gpus = f"{s.total_gpus} x {s.gpu_memory_gib:g} GiB"
    host = "" if s.host_memory_gib is None else f" with {s.host_memory_gib:g} GiB of host RAM"
    rows = [r for r in p.rows if stages.allowed(r.option, allows)]
    text = f"nothing fits on {gpus}{host}: " + " | ".join(f"{stages.get(r.option).label}: {r.why}" for r in rows)
    other = next((r for name in stages.PREFERENCE for r in p.rows
                  if r.option == name and r.fits and not stages.allowed(name, allows)), None)
    if other is not None:
        text += (f" (SFT_OPTIMIZER={allows} allows no other; {stages.get(other.option).label} "
                 f"{other.why}: SFT_OPTIMIZER=auto runs it)")
    return text


def needs(p: Plan, allows: str = "auto") -> str:
    """What a machine would need for the option of the lowest peak: GPUs of that much memory (GPU_FREE_FRACTION of
    each kept free) and, for offload, that much host RAM; and how to see the configuration for one."""
    best = min((r for r in p.rows if stages.allowed(r.option, allows)), key=lambda r: r.peak)
    gib = best.peak / (1 - GPU_FREE_FRACTION) / GIB
    host = f" and {best.host / GIB:.1f} GiB of host RAM per node" if stages.get(best.option).offload else ""
    return (f"it would need {p.setup.total_gpus} GPU(s) of at least {gib:.1f} GiB each{host} ("
            f"{stages.get(best.option).label}, the lowest peak: {best.peak / GIB:.2f} GiB, with "
            f"{GPU_FREE_FRACTION:.0%} of each GPU kept free), or more GPUs; `config --gpus N --gpu-memory GIB` "
            "shows the configuration for such a machine")


def _at_stage(inputs: Inputs, d: Decision, stage: Stage, config: Mapping[str, Any]) -> Decision:
    """d at this stage, its layers compiled or not, and Liger's kernels and the attention kernel for that."""
    s, m = inputs.settings, inputs.machine
    compiled, why_compile = rules.compile_model(s, d.ranks, stage, d.sequence_parallel)
    liger, why_liger = rules.liger(s, d.ranks, m, compiled)
    attention, why_attention = rules.attention(s, d.ranks, m, inputs.shape, d.sequence_parallel, compiled)
    config, why_overlap = stages.overlap_comm(config, stage, d.ranks.world, inputs.user_config is not None)
    return _replace(d, stage=stage, ds_config=config, compile=compiled, liger=liger, attention=attention,
                    reasons={**d.reasons, "compile": why_compile, "liger": why_liger, "attention": why_attention,
                             "overlap_comm": why_overlap})


def _fitting_level(inputs: Inputs, d: Decision) -> Split | None:
    """d's split with the first way of keeping activations the setting allows that fits d's stage."""
    if _checkpoint_split_stands(inputs):
        return d.split
    return next((split for split in _levels(inputs, d) if row_for(inputs, d, split).fits), None)


def _checkpoint_split_stands(inputs: Inputs) -> bool:
    return inputs.record is not None and inputs.record.batch is not None


def _levels(inputs: Inputs, d: Decision) -> tuple[Split, ...]:
    return rules.levels(inputs.settings, d.split, d.ranks.on_gpu)


def _setup(inputs: Inputs, d: Decision, split: Split) -> Setup:
    m, s = inputs.machine, inputs.settings
    host_gib = m.host_memory_bytes / GIB if m.host_memory_bytes else None
    if d.ranks.on_gpu:
        gpu_gib = min(m.gpus[g].memory_bytes for g in d.ranks.gpus) / GIB
    else:  # CPU ranks share the host
        gpu_gib = (host_gib or CPU_RANK_MEMORY_GIB * d.ranks.count) / d.ranks.count
    # A compiled layer kept the activations Liger's kernels keep (the same peak, measured: docs/speed.md)
    return Setup(d.ranks.count, gpu_gib, d.ranks.nodes, split.micro_batch, s.max_length,
                 split.gradient_checkpointing, host_gib, split.grad_accum, d.liger or d.compile,
                 split.offload_activations,
                 d.sequence_parallel, _one_pass_step(inputs, d),
                 memory.flex_mask_elements(split.micro_batch, s.max_length, s.packing)
                 if d.attention == "flex_attention" else 0)


def _one_pass_step(inputs: Inputs, d: Decision) -> bool:
    """Whether the ranks' ZeRO-1/2 step runs in one pass (sft/ranks/patches/zero_step.py::zero_step_in_one_pass, for
    bf16 on GPUs with torch's fused AdamW, the Trainer's default, or the 8-bit options' AdamW, and no optimizer of
    the DeepSpeed file's own); the planner then counts no fp32 gradient partition. Offload and ZeRO-3 are left to
    memory.py."""
    optim = d.stage.optimizer or inputs.settings.extra_trainer_args.get("optim", "adamw_torch_fused")
    return (d.ranks.on_gpu and d.bf16 and optim in ("adamw_torch_fused", stages.EIGHT_BIT_OPTIM)
            and not d.ds_config.get("optimizer"))


def _plan(inputs: Inputs, d: Decision, split: Split) -> Plan:
    return plan_from_shape(inputs.shape, **dataclasses.asdict(_setup(inputs, d, split)))


def row_for(inputs: Inputs, d: Decision, split: Split) -> Row:
    return estimate_row(d.stage, inputs.shape, _setup(inputs, d, split), d.ds_config)


def with_stage(inputs: Inputs, d: Decision, stage: Stage, config: Mapping[str, Any], why: str,
                split: Split | None = None) -> Decision:
    """d at another stage: its config, plan and row, and pin_memory decided for it."""
    d = _at_stage(inputs, d, stage, config)
    d = _replace(d, reasons={**d.reasons, "stage": why, "optimizer": optimizer.optimizer_text(inputs.settings, stage,
                                                                                          d.ds_config)})
    return with_split(inputs, d, split or d.split)


def at_next_stage(inputs: Inputs, d: Decision, stage: Stage, config: Mapping[str, Any], why: str) -> Decision:
    """d moved to the next stage after its probe. Where the job chose how activations are kept and the split
    (auto, not searched), they are planned afresh: the new stage's states are smaller, so the checkpoints go back
    to the GPU where they fit there, and on GPUs the batch search's rule picks the splits that can be the fastest
    (fewer rows a pass without checkpointing among them; a lone one is taken untimed). On CPU ranks checkpointing
    stays on, as the last probe needed it. Before, the stage moved with the escalated split, its checkpoints still
    in host memory: slower than the search's pick (measured: docs/benchmarks.md, Qwen3-4B on one 80 GB GPU)."""
    if (inputs.settings.gradient_checkpointing != "auto" or d.searched or d.reshard is not None
            or _checkpoint_split_stands(inputs)):
        return with_stage(inputs, d, stage, config, why)
    at = _at_stage(inputs, d, stage, config)
    d = _with_search(inputs, with_stage(inputs, at, stage, config, why,
                                        _fitting_level(inputs, at) or _levels(inputs, at)[-1]))
    why_level = (f"{d.split.checkpointing_text}, auto: planned again for {stage.label} after the probe "
                 f"({d.row.peak / GIB:.2f} GiB predicted)")
    return _replace(d, reasons={**d.reasons, "gradient_checkpointing": why_level})


def with_split(inputs: Inputs, d: Decision, split: Split) -> Decision:
    plan = _plan(inputs, d, split)
    row = dataclasses.replace(row_for(inputs, d, split), **longest_rows(d.stage, inputs.shape, _setup(inputs, d, split),
                                                                     d.ds_config, plan.split))
    d = _replace(d, split=split, plan=plan, row=row)
    pin, why = _pin_memory(inputs.machine, d)
    config = d.ds_config if pin else stages.without_pinned_memory(dict(d.ds_config))
    return _replace(d, pin_memory=pin, ds_config=config, reasons={**d.reasons, "pin_memory": why})


def _pin_memory(machine: Machine, d: Decision) -> tuple[bool, str]:
    return rules.pin_memory_rule(machine.memlock_bytes, d.offload, d.row.host)


def _auto_checkpointing(inputs: Inputs, d: Decision) -> Decision:
    """Recomputing activations costs a third more compute: off where the stage fits without it."""
    off = dataclasses.replace(d.split, gradient_checkpointing=False, offload_activations=False)
    if row_for(inputs, d, off).fits:
        d = with_split(inputs, d, off)
        why = f"off, auto: {d.stage.label} fits without it ({d.row.peak / GIB:.2f} GiB predicted)"
    elif d.split.offload_activations:
        why = (f"offload, auto: {d.stage.label} fits only with its checkpoints in host memory "
               f"({d.row.peak / GIB:.2f} GiB predicted)")
    else:
        why = f"on, auto: {d.stage.label} does not fit without it"
    return _replace(d, reasons={**d.reasons, "gradient_checkpointing": why})


def _search_on(inputs: Inputs, d: Decision) -> bool:
    s = inputs.settings
    probing = s.probe_steps > 0 and inputs.record is None
    return probing and (s.batch_search == "true" or (s.batch_search == "auto" and d.ranks.on_gpu))


def _with_search(inputs: Inputs, d: Decision) -> Decision:
    """Which splits the batch search times; a lone candidate is adopted without timing."""
    if not _search_on(inputs, d):
        return d
    setting = inputs.settings.gradient_checkpointing
    rows = d.split.rows
    offload = d.split.offload_activations
    found = rules.batch_candidates(
        rows, (False, True) if setting == "auto" else (setting != "false",),
        fits=lambda mb, ckpt: row_for(inputs, d, Split(mb, rows // mb, ckpt, ckpt and offload)).fits_gpu,
        every=inputs.settings.batch_search == "true", offload=offload)
    if len(found) >= 2:
        why = f"times {len(found)} splits of {rows} rows per step: " + "; ".join(f.text() for f in found)
        return _replace(d, search=tuple(found), reasons={**d.reasons, "batch_search": why})
    if found and found[0] != d.split:  # the planned split does not fit this stage: this one does
        d = _replace(with_split(inputs, d, found[0]), searched=True)
    why = (f"{found[0].text()} is the one split of {rows} rows per step that can be the fastest; nothing to time"
           if found else "no split fits by the plan: the probe decides")
    return _replace(d, reasons={**d.reasons, "batch_search": why})


def adopt(inputs: Inputs, d: Decision, split: Split, why: str) -> Decision:
    """The split the batch search measured fastest (recorded in checkpoints, so a resume keeps it)."""
    d = with_split(inputs, d, split)
    return _replace(d, searched=True, search=(), reasons={**d.reasons, "split": why})


def cap_steps(d: Decision, steps: int, why: str) -> Decision:
    """Train `steps` optimizer steps in all (recorded in checkpoints, so a resume stops at the same step)."""
    return _replace(d, max_steps=steps, reasons={**d.reasons, "max_steps": f"{steps} steps, {why}"})


def _replace(d: Decision, **changes: Any) -> Decision:
    return dataclasses.replace(d, **changes)
