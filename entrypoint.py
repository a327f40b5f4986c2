#!/usr/bin/env python3
"""Full fine-tuning of a causal LM with TRL's SFTTrainer on DeepSpeed ZeRO, configured by environment.

    docker run --gpus all -e SFT_MODEL=Qwen/Qwen3-8B -v /data:/data IMAGE          # the whole job
    python entrypoint.py [run|probe|status|plan|doctor|config|export]              # the same, on a host

The job: check the settings, probe SFT_PROBE_STEPS steps, train, write final/ and a summary.
Watch it: `tail -f OUTPUT/run/events.jsonl`, or `entrypoint.py status OUTPUT` (or `status owner/repo`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
from typing import TYPE_CHECKING

import click

from sft import exitcodes
from sft.controller import inputs as checks
from sft.hub import transport
from sft.settings import ECOSYSTEM_VARS, Settings, SettingsError, describe, from_env, refusal

if TYPE_CHECKING:
    from sft.controller.machine import ImportCheck
    from sft.controller.standby import Standby


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


def deepspeed_logs_to_stderr() -> None:
    """DeepSpeed's logger writes to the stdout it finds at import: keep it off what `config` and `plan`
    print for programs, by importing it while stdout points at stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: F401


def load_settings(finders) -> Settings:
    """Settings from the environment and the inputs they name (controller/inputs.py's finders), or exit 2
    listing every problem of both at once, before anything is written."""
    s, problems = checks.checked(finders)
    if problems:
        click.echo(refusal("settings are", problems), err=True)
        sys.exit(exitcodes.BAD_SETTINGS)
    return s


def job_settings() -> tuple[Settings, ImportCheck | None, Standby | None]:
    """load_settings for a job (`run`, `probe`), with what runs best from the process's start begun before the
    settings' inputs are read, and stopped if they are refused: FlashAttention-4's import check
    (controller/machine.py::early_import_check says why) and, where the settings themselves are valid, the ranks
    (controller/standby.py)."""
    from sft import nodes
    from sft.controller import machine, standby

    try:
        s, valid = from_env(), True
    except SettingsError as e:
        s, valid = e.settings, False
    check = machine.early_import_check(s.attention)
    ranks = standby.start(s, nodes.from_env(os.environ)) if valid else None  # their inputs are checked meanwhile
    try:
        return load_settings(checks.JOB), check, ranks
    except SystemExit:
        if check is not None:
            check.cancel()
        if ranks is not None:
            ranks.end()
        raise


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
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Fine-tune a model as the SFT_* environment variables say. With no command: `run`."""
    transport.choose()  # before anything imports huggingface_hub, which reads it then; the ranks inherit it
    if ctx.invoked_subcommand is None:
        ctx.invoke(run)


@cli.command()
def run() -> None:
    """Validate, probe, train the full epoch(s), write final/ and the summary."""
    from sft.controller import job

    sys.exit(job.run(*job_settings()))


@cli.command()
def probe() -> None:
    """Only the timing probe: speed, peak memory per rank, projected duration and cost."""
    from sft.controller import job

    sys.exit(job.run(*job_settings(), probe_only=True))


@cli.command()
@click.argument("target", default="", required=False)
@click.option("--revision", help="With a Hub repo: the branch (default: main).")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs.")
def status(target: str, revision: str | None, as_json: bool) -> None:
    """Where a run is: TARGET is its output folder (default: SFT_OUTPUT_DIR) or its Hub repo (owner/name).

    The phase, the step and the time left, the newest complete checkpoint on disk and on the Hub, an upload
    in progress, the final model, the end and its exit code. Reads the folder or the repo only."""
    import os
    from pathlib import Path

    from sft.controller import status as run_status

    target = target or os.environ.get("SFT_OUTPUT_DIR", "output")
    if Path(target).is_dir():
        found = run_status.of_folder(Path(target))
    elif "/" in target and not target.startswith((".", "/", "~")):
        found = _repo_status_or_exit(target, revision)
    else:
        click.echo(f"error: {target} is neither an output folder nor a Hub repo (owner/name)", err=True)
        sys.exit(exitcodes.BAD_SETTINGS)
    click.echo(found.to_json() if as_json else found.text())


def _repo_status_or_exit(repo_id: str, revision: str | None):
    from sft.controller import status as run_status
    from sft.hub.errors import http_status, short_error

    try:
        return run_status.of_repo(repo_id, revision)
    except Exception as e:  # noqa: BLE001 - one line naming the repo, not the client's traceback
        status = http_status(e)
        click.echo(f"error: cannot read {repo_id} from the Hub ({short_error(e)}): check the name, and a token "
                   "that can read it (HF_TOKEN or `hf auth login`)", err=True)
        sys.exit(exitcodes.HUB_AUTH if status in (401, 403, 404) else exitcodes.HUB_UNREACHABLE)


@cli.command()
def config() -> None:
    """Print the resolved settings, every decision (the data's too) and the DeepSpeed JSON the Trainer will use."""
    from transformers import AutoConfig

    from sft.controller import machine
    from sft.controller.output import Paths
    from sft.controller.runs import make_spec
    from sft.ranks.trainer import filled_ds_config, trainer_arguments

    deepspeed_logs_to_stderr()  # before the checks, which read a DeepSpeed file with DeepSpeed
    s = load_settings(checks.CONFIG)
    found = machine.measure(s.output_dir).machine
    d = decided_or_exit(inputs_or_exit(s, found, data_or_exit(s, found).facts))
    spec = make_spec(s, d, Paths(s.output_path), "train", s.output_path, s.max_steps)
    args = trainer_arguments(spec, in_rank=False)
    # Steps are known only once the data is tokenised; the scheduler's "auto" steps show as max_steps.
    # DeepSpeed's train_batch_size counts data-parallel ranks: world / the GPUs that share each row
    filled = filled_ds_config(dict(d.ds_config), args, d.ranks.world // d.sequence_parallel,
                              AutoConfig.from_pretrained(s.model), max(s.max_steps, 1))
    click.echo(json.dumps({"settings": s.to_dict(), "decision": d.resolved(), "reasons": dict(d.reasons),
                           "data": d.data.to_dict() if d.data else None, "ranks": d.ranks.world,
                           "deepspeed": filled}, indent=2))


def inputs_or_exit(s: Settings, found, data=None):
    """The decision's inputs, or exit with the one-line reason they cannot be read."""
    from sft.controller import inputs
    from sft.planner.inputs import CannotRun

    try:
        return inputs.read(s, found, data=data)
    except CannotRun as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)


def data_or_exit(s: Settings, found):
    """The data read and checked as the job reads it, or exit 2 listing every problem."""
    from sft.controller import data
    from sft.data import DataError
    from sft.planner import rules
    from sft.planner.inputs import CannotRun

    try:
        ranks, _ = rules.choose_ranks(s, found)
        return data.read(s, ranks)
    except CannotRun as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except DataError as e:
        click.echo(refusal("data is", e.problems), err=True)
        sys.exit(exitcodes.BAD_SETTINGS)


@cli.command()
@click.option("--rows", default=2, show_default=True, help="How many of the first rows to show.")
@click.option("--tokens", "per_token", is_flag=True, help="One line per token: its id, text, and whether it "
              "carries the loss.")
@click.option("--eval", "of_eval", is_flag=True, help="The evaluation rows instead of the training rows.")
def data(rows: int, per_token: bool, of_eval: bool) -> None:
    """Check the data as the job does, then show how its first rows are tokenised and which tokens carry the loss."""
    from sft.controller import machine
    from sft.data import show
    from sft.data.tokens import Labeller
    from sft.planner import data as data_rules

    s = load_settings(checks.ALWAYS)
    deepspeed_logs_to_stderr()
    found = data_or_exit(s, machine.measure(s.output_dir).machine)
    click.echo("\n".join(found.notes))
    _, why = data_rules.loss_mode(s.loss_on, found.facts)
    click.echo(f"loss on: {why}")
    shown = found.eval if of_eval else found.train
    if shown is None:
        raise click.UsageError("no evaluation rows: set SFT_EVAL_DATASET, SFT_EVAL_SPLIT or SFT_EVAL_FRACTION")
    labeller = Labeller(found.tokenizer, found.loss_on, s.max_length, json.loads(s.trainer_args or "{}"))
    click.echo(show.render(shown, labeller, rows, s.packing, per_token))


def decided_or_exit(given):
    from sft.planner.decide import decide
    from sft.planner.inputs import CannotRun

    try:
        return decide(given)
    except CannotRun as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)


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
@click.option("--sequence-parallel", help="auto, or GPUs of a node that share each row (default: "
              "SFT_SEQUENCE_PARALLEL; a split needs SFT_PACKING=false).")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs (GiB: bytes / 2**30, two decimals).")
def plan(model, gpus, gpu_memory, nodes, micro_batch, grad_accum, max_length, gradient_checkpointing, host_memory,
         liger, sequence_parallel, as_json):
    """Predict memory per GPU for every ZeRO option and decide as the job would (reads config.json only)."""
    from dataclasses import replace

    from sft.controller import machine
    from sft.planner.decide import decide
    from sft.planner.inputs import GPU, CannotRun
    from sft.planner.plan import format_table
    from sft.units import GIB

    deepspeed_logs_to_stderr()
    s = load_settings(checks.DECIDING)
    found = machine.measure(s.output_dir).machine
    if not found.gpus and (gpus is None or gpu_memory is None):
        raise click.UsageError("no GPU here: give --gpus N and --gpu-memory GIB (e.g. --gpus 8 --gpu-memory 79.25)")
    if gpus or gpu_memory:
        count, memory = gpus or len(found.gpus), gpu_memory or found.gpus[0].memory_bytes / GIB
        found = replace(found, gpus=(GPU("GPU", int(memory * GIB)),) * count)
    found = replace(found, nodes=nodes, **({"host_memory_bytes": int(host_memory * GIB)} if host_memory else {}))
    switch = {True: "true", False: "false", None: None}
    asked = {"model": model, "micro_batch": micro_batch, "grad_accum": grad_accum, "max_length": max_length,
             "gradient_checkpointing": switch[gradient_checkpointing], "liger_kernels": switch[liger],
             "batch_search": "false", "sequence_parallel": _auto_or_int("--sequence-parallel", sequence_parallel)}
    s = replace(s, **{k: v for k, v in asked.items() if v is not None})
    given = inputs_or_exit(s, found)
    try:
        d = decide(given)
        p, explained = d.plan, d.explain()
    except CannotRun as e:
        if e.plan is None:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        p, explained, d = e.plan, f"  stage: {e}", None
    if as_json:
        click.echo(json.dumps({**p.to_dict(), "decision": d.resolved() if d else None}, indent=2))
    else:
        click.echo(format_table(p) + "\n\ndecided:\n" + explained)


def _auto_or_int(option: str, value: str | None) -> int | str | None:
    if value is None or value.lower() == "auto":
        return value and "auto"
    if not value.isdigit() or int(value) < 1:
        raise click.BadParameter(f"{value!r}: expected auto or a whole number of GPUs", param_hint=option)
    return int(value)


@cli.command()
def doctor() -> None:
    """Check this machine for the job: GPUs, nvcc and CPU Adam, memlock, /dev/shm, disk, host RAM, links."""
    from sft.controller import inputs, machine, preflight
    from sft.planner.decide import decide
    from sft.planner.inputs import CannotRun

    s = load_settings(checks.DECIDING)
    facts = machine.measure(s.output_dir)
    try:
        given = inputs.read(s, facts.machine)
        d = decide(given)
        needs = preflight.Needs.of(d, given.shape.total_params, s.save_total_limit, s.extra_trainer_args)
        facts = machine.measure_links(facts, d.ranks)
        click.echo(f"for {s.model} with {d.stage.label} on {d.ranks.world} rank(s):")
    except CannotRun as e:
        click.echo(f"the run's needs are unknown ({e}); checking the machine alone:")
        needs = preflight.Needs()
    results = preflight.run(facts, needs)
    click.echo(preflight.format_checks(results))
    sys.exit(exitcodes.PREFLIGHT if preflight.failed(results) else exitcodes.DONE)


@cli.command()
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
def export(checkpoint: str, out: str) -> None:
    """Full fp32 weights from CHECKPOINT (a checkpoint-N folder) into OUT, via DeepSpeed's zero_to_fp32."""
    from sft.controller import export as exporter

    try:
        exporter.export(checkpoint, out)
    except exporter.NotACheckpoint as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(exitcodes.BAD_SETTINGS)
    click.echo(f"wrote fp32 weights to {out}")


if __name__ == "__main__":
    cli()
