#!/usr/bin/env python3
"""Full fine-tuning of a causal LM with TRL's SFTTrainer on DeepSpeed ZeRO, configured by environment.

    docker run --gpus all -e SFT_MODEL=Qwen/Qwen3-8B -v /data:/data IMAGE          # the whole job
    python entrypoint.py [run|probe|plan|doctor|config|export]                     # the same, on a host

The job: check the settings, probe SFT_PROBE_STEPS steps, train, write final/ and a summary.
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap

import click

from sft import exitcodes
from sft.settings import ECOSYSTEM_VARS, Settings, SettingsError, describe, from_env


def _variables_help() -> str:
    lines = ["\b", "Environment variables (default in brackets):"]
    for var, default, help in describe():
        lines.append(f"  {var} [{default}]")
        lines += ["      " + line for line in textwrap.wrap(help, 72)]
    lines += ["", "\b", "Read under their own names:"]
    lines += [f"  {var}: {help}" for var, help in ECOSYSTEM_VARS.items()]
    lines += ["", "\b", "Exit codes:"]
    lines += [f"  {value:>3} {name}" for name, value in vars(exitcodes).items() if name.isupper()]
    return "\n".join(lines)


def load_settings() -> Settings:
    """Settings from the environment, or exit 2 listing every problem (before anything is written)."""
    try:
        return from_env()
    except SettingsError as e:
        click.echo("error: the settings are not valid; nothing was started:", err=True)
        for problem in e.problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(exitcodes.BAD_SETTINGS)


@click.group(invoke_without_command=True, epilog=_variables_help(),
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Fine-tune a model as the SFT_* environment variables say. With no command: `run`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(run)


@cli.command()
def run() -> None:
    """Validate, probe, train the full epoch(s), write final/ and the summary."""
    from sft import job

    sys.exit(job.run(load_settings()))


@cli.command()
def probe() -> None:
    """Only the timing probe: speed, peak memory per rank, projected duration and cost."""
    from sft import job

    sys.exit(job.run(load_settings(), probe_only=True))


@cli.command()
def config() -> None:
    """Print the resolved settings and the DeepSpeed JSON the Trainer will use, "auto" values filled."""
    from transformers import AutoConfig

    from sft import dsconfig
    from sft.job import resolve
    from sft.launch import detect_ranks
    from sft.train import trainer_arguments

    s = load_settings()
    ranks = detect_ranks(s)
    # auto checkpointing is decided by the planner at run time; shown here as on, the safe side
    args = trainer_arguments(resolve(s, ranks, s.gradient_checkpointing != "false"), "train", s.output_dir, None,
                             s.max_steps, ranks.on_gpu, in_rank=False)
    # Steps are known only once the data is tokenised; the scheduler's "auto" steps show as max_steps.
    filled = dsconfig.filled(dsconfig.load(s.zero_stage, s.ds_config), args, ranks.count,
                             AutoConfig.from_pretrained(s.model), max(s.max_steps, 1))
    click.echo(json.dumps({"settings": s.to_dict(), "ranks": ranks.count, "deepspeed": filled}, indent=2))


@cli.command()
@click.option("--model", help="Hub name or local folder (default: SFT_MODEL).")
@click.option("--gpus", type=int, help="GPUs per node (default: detected).")
@click.option("--gpu-memory", type=float, help="Memory per GPU in GiB (default: detected).")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes.")
@click.option("--micro-batch", type=int, help="Sequences per GPU per step (default: SFT_MICRO_BATCH).")
@click.option("--grad-accum", type=int, help="Micro-batches per optimizer step (default: SFT_GRAD_ACCUM).")
@click.option("--max-length", type=int, help="Tokens per sequence (default: SFT_MAX_LENGTH).")
@click.option("--gradient-checkpointing/--no-gradient-checkpointing", default=None,
              help="(default: SFT_GRADIENT_CHECKPOINTING)")
@click.option("--host-memory", type=float, help="Host RAM per node in GiB (default: detected).")
@click.option("--liger/--no-liger", default=None, help="Liger's kernels (default: SFT_LIGER_KERNELS, auto: on "
              "with GPUs here and liger-kernel installed).")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs (GiB: bytes / 2**30, two decimals).")
def plan(model, gpus, gpu_memory, nodes, micro_batch, grad_accum, max_length, gradient_checkpointing, host_memory,
         liger, as_json):
    """Predict memory per GPU for every ZeRO option and pick the lowest that fits (reads config.json only)."""
    from sft import dsconfig, plan as planner
    from sft.job import _host_memory_gib, liger_on
    from sft.launch import detect_ranks
    from sft.plan import GIB

    s = load_settings()
    if liger is None:
        liger = liger_on(s, detect_ranks(s))
    if gpus is None or gpu_memory is None:
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError("no GPU here: give --gpus N and --gpu-memory GIB (e.g. --gpus 8 --gpu-memory 79.25)")
        gpus = gpus or torch.cuda.device_count()
        gpu_memory = gpu_memory or torch.cuda.get_device_properties(0).total_memory / GIB
    # DeepSpeed's logger writes to the stdout it finds at import: keep it off the table and the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        p = planner.plan(model or s.model, gpus, gpu_memory, nodes, micro_batch or s.micro_batch,
                         max_length or s.max_length,
                         s.gradient_checkpointing != "false" if gradient_checkpointing is None
                         else gradient_checkpointing,
                         host_memory or _host_memory_gib(), {o: dsconfig.load(o) for o in dsconfig.FILES},
                         grad_accum or s.grad_accum, liger)
    click.echo(p.to_json() if as_json else planner.format_table(p))


@cli.command()
def doctor() -> None:
    """Check this machine for the job: GPUs, nvcc and CPU Adam, memlock, /dev/shm, disk, host RAM, links."""
    from sft import preflight

    s = load_settings()
    checks = preflight.run_preflight(s.output_dir, zero_stage=s.zero_stage, save_total_limit=s.save_total_limit)
    click.echo(preflight.format_checks(checks))
    sys.exit(exitcodes.PREFLIGHT if preflight.failed(checks) else exitcodes.DONE)


@cli.command()
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
def export(checkpoint: str, out: str) -> None:
    """Full fp32 weights from CHECKPOINT (a checkpoint-N folder) into OUT, via DeepSpeed's zero_to_fp32."""
    from sft import export as exporter

    exporter.export(checkpoint, out)
    click.echo(f"wrote fp32 weights to {out}")


if __name__ == "__main__":
    cli()
