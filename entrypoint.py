#!/usr/bin/env python3
"""Full fine-tuning of a causal LM with TRL's SFTTrainer on DeepSpeed ZeRO, configured by environment.

    docker run --gpus all -e SFT_MODEL=Qwen/Qwen3-8B -v /data:/data IMAGE          # the whole job
    python entrypoint.py [run|probe|config|export]                                 # the same, on a host

The job: check the settings, probe SFT_PROBE_STEPS steps, train, write final/ and a summary.
"""

from __future__ import annotations

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
    from sft.launch import detect_ranks
    from sft.train import trainer_arguments

    s = load_settings()
    ranks = detect_ranks(s)
    args = trainer_arguments(s.to_dict(), "train", s.output_dir, None, s.max_steps, ranks.on_gpu,
                             in_rank=False)
    # Steps are known only once the data is tokenised; the scheduler's "auto" steps show as max_steps.
    filled = dsconfig.filled(dsconfig.load(s.zero_stage, s.ds_config), args, ranks.count,
                             AutoConfig.from_pretrained(s.model), max(s.max_steps, 1))
    click.echo(json.dumps({"settings": s.to_dict(), "ranks": ranks.count, "deepspeed": filled}, indent=2))


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
