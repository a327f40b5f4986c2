#!/usr/bin/env python3
"""Full fine-tuning of a causal LM with TRL's SFTTrainer on DeepSpeed ZeRO, configured by environment.

    docker run --gpus all -e SFT_MODEL=Qwen/Qwen3-8B -v /data:/data IMAGE          # the whole job
    python entrypoint.py [run|probe|status|plan|doctor|config|export]              # the same, on a host

The job: check the settings, probe SFT_PROBE_STEPS steps, train, write final/ and a summary.
Watch it: `tail -f OUTPUT/run/events.jsonl`, or `entrypoint.py status OUTPUT` (or `status owner/repo`).
"""

from __future__ import annotations

import sys
import textwrap

import click

from sft import exitcodes
from sft.controller import commands
from sft.lifeline import leave  # the job's exit: its last uploads and files done, without the interpreter's teardown
from sft.settings import ECOSYSTEM_VARS, describe


# GiB of a GPU or a host: the planner divides by them, so 0 and less are refused as SFT_ values are, before it runs
POSITIVE = click.FloatRange(min=0, min_open=True)


def _variables_help() -> str:
    lines = ["\b", "Environment variables (default in brackets):"]
    for var, default, help in describe():
        lines.append(f"  {var} [{default}]")
        lines += ["      " + line for line in textwrap.wrap(help, 72)]
    lines += ["", "\b", "Read under their own names:"]
    lines += [f"  {var}: {help}" for var, help in ECOSYSTEM_VARS.items()]
    lines += ["", "\b", "Exit codes:"]
    for value, name, meaning in exitcodes.meanings():
        lines += textwrap.wrap(f"{value:>3} {name}: {meaning}", 90, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def _print_version(ctx: click.Context, param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from sft.version import text

    click.echo(text())
    ctx.exit()


@click.group(invoke_without_command=True, epilog=_variables_help(),
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="The job's version, its code's sha256 and the libraries' versions.")
@click.option("--config", "job_file", metavar="FILE", help="A YAML job file of settings, as SFT_CONFIG names one "
              "(the environment wins over it).")
@click.pass_context
def cli(ctx: click.Context, job_file: str | None) -> None:
    """Fine-tune a model as the SFT_* environment variables say. With no command: `run`."""
    _close_stdin()
    if job_file is not None:  # read as the settings read SFT_CONFIG, in this process and every one it starts
        import os

        os.environ["SFT_CONFIG"] = job_file
    if ctx.invoked_subcommand is None:
        ctx.invoke(run)


def _close_stdin() -> None:
    """A batch job answers no question: stdin is /dev/null for this process and every one it starts, so a library
    that would ask (transformers' "run the custom code? [y/N]" of a model's own code) reads end-of-file and
    refuses, and nothing typed or piped in can say yes. SFT_TRUST_REMOTE_CODE is the one way to consent."""
    import os

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin, for its whole life


@cli.command()
def run() -> None:
    """Validate, probe, train the full epoch(s), write final/ and the summary."""
    leave(commands.job(probe_only=False))


@cli.command()
def probe() -> None:
    """Only the timing probe: speed, peak memory per rank, projected duration and cost."""
    leave(commands.job(probe_only=True))


@cli.command()
@click.argument("target", default="", required=False)
@click.option("--revision", help="With a Hub repo: the branch (default: main).")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs.")
@click.option("--check", is_flag=True, help="One line and an exit code, for a probe (a Kubernetes exec probe): 0 "
              "running or done, 1 stalled (no sign of life for --stalled-after), 2 ended with another exit code, "
              "3 no run in the folder. An output folder only.")
@click.option("--stalled-after", type=click.FloatRange(min=0, min_open=True), default=1800, show_default=True,
              help="With --check: seconds without a step, an upload or, before training, the job's heartbeat, after "
              "which a run is stalled (more than a checkpoint's save or an evaluation takes).")
def status(target: str, revision: str | None, as_json: bool, check: bool, stalled_after: float) -> None:
    """Where a run is: TARGET is its output folder (default: SFT_OUTPUT_DIR) or its Hub repo (owner/name).

    The phase, the step and the time left, the newest complete checkpoint on disk and on the Hub, an upload
    in progress, the final model, the end and its exit code. Reads the folder or the repo only."""
    if check:
        sys.exit(commands.status_check(target, stalled_after))
    commands.status(target, revision, as_json)


@cli.command()
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs per node of the machine to configure for (default: "
              "detected).")
@click.option("--gpu-memory", type=POSITIVE, help="Memory per GPU in GiB (default: detected).")
@click.option("--host-memory", type=POSITIVE, help="Host RAM per node in GiB (default: detected).")
@click.option("--env", "env_of", is_flag=False, flag_value="", default=None, metavar="[FOLDER]",
              help="Instead: the settings as an env file (`docker run --env-file`) that reproduces them: the job's "
              "in its output FOLDER, finished or running, or with no FOLDER this environment's. No secret is in it.")
def config(gpus: int | None, gpu_memory: float | None, host_memory: float | None, env_of: str | None) -> None:
    """Print the resolved settings, every decision (the data's too), the Trainer's arguments and DeepSpeed's JSON: for
    this machine, or the one --gpus and --gpu-memory describe (as `plan` takes them)."""
    if env_of is not None:
        commands.env_file(env_of or None)
        return
    commands.config(gpus, gpu_memory, host_memory)


@cli.command()
@click.option("--rows", default=2, show_default=True, type=click.IntRange(min=0),
              help="How many of the first rows to show (0: the checks alone).")
@click.option("--tokens", "per_token", is_flag=True, help="One line per token: its id, text, and whether it "
              "carries the loss.")
@click.option("--eval", "of_eval", is_flag=True, help="The evaluation rows instead of the training rows.")
def data(rows: int, per_token: bool, of_eval: bool) -> None:
    """Check the data as the job does, then show how its first rows are tokenised and which tokens carry the loss."""
    commands.data(rows, per_token, of_eval)


@cli.command()
@click.option("--model", help="Hub name or local folder (default: SFT_MODEL).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs per node (default: detected).")
@click.option("--gpu-memory", type=POSITIVE, help="Memory per GPU in GiB (default: detected).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes.")
@click.option("--micro-batch", type=click.IntRange(min=1), help="Sequences per GPU per step (default: "
              "SFT_MICRO_BATCH).")
@click.option("--grad-accum", type=click.IntRange(min=1), help="Micro-batches per optimizer step (default: "
              "SFT_GRAD_ACCUM).")
@click.option("--max-length", type=click.IntRange(min=8), help="Tokens per sequence (default: SFT_MAX_LENGTH).")
@click.option("--gradient-checkpointing/--no-gradient-checkpointing", default=None,
              help="(default: SFT_GRADIENT_CHECKPOINTING)")
@click.option("--host-memory", type=POSITIVE, help="Host RAM per node in GiB (default: detected).")
@click.option("--liger/--no-liger", default=None, help="Liger's kernels (default: SFT_LIGER_KERNELS, auto: on "
              "with GPUs here and liger-kernel installed).")
@click.option("--sequence-parallel", help="auto, or GPUs of a node that share each row (default: "
              "SFT_SEQUENCE_PARALLEL; a split needs SFT_PACKING=false).")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs (GiB: bytes / 2**30, two decimals).")
def plan(model, gpus, gpu_memory, nodes, micro_batch, grad_accum, max_length, gradient_checkpointing, host_memory,
         liger, sequence_parallel, as_json):
    """Predict memory per GPU for every ZeRO option and decide as the job would (reads config.json only)."""
    switch = {True: "true", False: "false", None: None}
    asked = {"model": model, "micro_batch": micro_batch, "grad_accum": grad_accum, "max_length": max_length,
             "gradient_checkpointing": switch[gradient_checkpointing], "liger_kernels": switch[liger],
             "batch_search": "false", "sequence_parallel": _auto_or_int("--sequence-parallel", sequence_parallel)}
    commands.plan(asked, gpus, gpu_memory, nodes, host_memory, as_json)


def _auto_or_int(option: str, value: str | None) -> int | str | None:
    if value is None or value.lower() == "auto":
        return value and "auto"
    if not value.isdigit() or int(value) < 1:
        raise click.BadParameter(f"{value!r}: expected auto or a whole number of GPUs", param_hint=option)
    return int(value)


@cli.command()
def doctor() -> None:
    """Check this machine for the job: GPUs, nvcc and CPU Adam, memlock, /dev/shm, disk, host RAM, links."""
    commands.doctor()


@cli.command()
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
def export(checkpoint: str, out: str) -> None:
    """Full fp32 weights from CHECKPOINT (a checkpoint-N folder) into OUT, via DeepSpeed's zero_to_fp32."""
    commands.export(checkpoint, out)


if __name__ == "__main__":
    cli()
