"""The commands besides the job itself (entrypoint.py declares them): each starts where the job starts
(prepare.py) and prints what it found. A problem ends the command with the job's exit code and one line, or the
whole list, on stderr."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import click

from .. import exitcodes, nodes, tracking
from ..planner import disk
from ..planner.inputs import GPU, CannotRun, Machine, Ranks
from ..settings import Settings, refusal
from ..settings.checks import model_problems
from ..units import GIB
from . import inputs, machine, prepare


def refuse(what: str, problems: list[str]) -> NoReturn:
    """Exit 2 listing every problem, before anything is started or written."""
    click.echo(refusal(what, problems), err=True)
    sys.exit(exitcodes.BAD_SETTINGS)


def refuse_settings(s: Settings, problems: list[str], reads_data: bool = True) -> NoReturn:
    """Exit 2 listing every problem of the settings and, for a command that reads the data, every problem of the data
    that can be found beside them (rowchecks.beside): a user fixes both at once, not one, then the other."""
    from .rowchecks import beside

    found = beside(s, problems) if reads_data else []
    click.echo(refusal("settings are", problems) + ("\n" + refusal("data is", found) if found else ""), err=True)
    sys.exit(exitcodes.BAD_SETTINGS)


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# DeepSpeed's warning at its first look for an accelerator on a machine with no GPU (accelerator/real_accelerator.py)
CPU_NOTICE = "Setting accelerator to CPU"


def deepspeed_logs_to_stderr() -> None:
    """DeepSpeed's logger writes to the stdout it finds at import: keep it off what `config` and `plan` print for
    programs, by importing it while stdout points at stderr."""
    deepspeed_quiet()
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: F401


def deepspeed_quiet() -> None:
    """On a machine with no GPU DeepSpeed warns, the first time it looks for an accelerator, that it sets the CPU
    ("if you have GPU or other accelerator, we were unable to detect it"): noise for a command that trains nothing
    here (`plan`, `config`, `data`), which names the machine's GPUs itself. That line alone is dropped, by a filter on
    DeepSpeed's logger (the same logger before and after DeepSpeed is imported); its other warnings and errors show."""
    import logging

    logging.getLogger("DeepSpeed").addFilter(_not_the_cpu_notice)  # once: the same filter is added once


def _not_the_cpu_notice(record) -> bool:
    return not str(record.msg).startswith(CPU_NOTICE)


def checked(finders: tuple[inputs.Finder, ...], gpus: tuple[GPU, ...] | None = None,
            nnodes: int = 1, reads_data: bool = True) -> tuple[Settings, Ranks]:
    """The settings and their ranks on this machine's GPUs (or `gpus`), or exit 2 listing every problem (the data's
    too, where the command reads it)."""
    found = prepare.checked(finders, machine.gpus() if gpus is None else gpus, nnodes)
    if found.problems or found.ranks is None:
        refuse_settings(found.settings, found.problems, reads_data)
    tracking.hide(tracking.unused(found.settings.report_to, found.settings.ds_config))  # before DeepSpeed's import
    return found.settings, found.ranks


def prepared(s: Settings, facts: machine.Facts, ranks: Ranks, read_data: bool = True) -> prepare.Prepared:
    """prepare(), or exit: 2 listing the data's problems, or the one-line reason no decision can run here."""
    from ..data import DataError

    try:
        return prepare.prepare(s, facts, ranks, read_data=read_data)
    except DataError as e:
        refuse("data is", e.problems)
    except CannotRun as e:
        fail(str(e), e.exit_code)


def described(gpus: int | None, gpu_memory: float | None, here: tuple[GPU, ...]) -> tuple[GPU, ...] | None:
    """The GPUs --gpus and --gpu-memory describe, each missing one taken from this machine's (None: neither given,
    this machine's own); with no GPU here both are needed."""
    if gpus is None and gpu_memory is None:
        return None
    if not here and (gpus is None or gpu_memory is None):
        raise click.UsageError("no GPU here: give --gpus N and --gpu-memory GIB (e.g. --gpus 8 --gpu-memory 79.25)")
    count, memory = gpus or len(here), gpu_memory or here[0].memory_bytes / GIB
    return (GPU(here[0].name if here else "GPU", round(memory * GIB)),) * count  # 0.001 GiB, not 0.000999999


def config(gpus: int | None = None, gpu_memory: float | None = None, host_memory: float | None = None) -> None:
    """The resolved settings, every decision (the data's too), the Trainer's arguments and the DeepSpeed JSON it
    will use: on this machine, or on the one the options describe."""
    from transformers import AutoConfig

    from .dsfile import filled_ds_config
    from .output import Paths
    from .runs import make_spec

    deepspeed_logs_to_stderr()  # before the checks, which read a DeepSpeed file with DeepSpeed
    named = described(gpus, gpu_memory, machine.gpus())
    s, ranks = checked(inputs.CONFIG, named)
    facts = machine.measure(s.output_dir, found=named)
    if host_memory is not None:
        facts = replace(facts, machine=replace(facts.machine, host_memory_bytes=round(host_memory * GIB)))
    d = prepared(s, facts, ranks).decision
    spec = make_spec(s, d, Paths(s.output_path), "train", s.output_path, s.max_steps)
    # TrainingArguments refuse bf16 where this process sees no GPU: for a machine named here, they are made without
    # it, and DeepSpeed's "auto" is filled with the run's precision
    here = dataclasses.replace(spec, trainer={**spec.trainer, "bf16": False}) if named and not machine.gpus() else spec
    args = here.sft_config(in_rank=False)
    # Steps are known only once the data is tokenised; the scheduler's "auto" steps show as max_steps.
    # DeepSpeed's train_batch_size counts data-parallel ranks: world / the GPUs that share each row
    filled = filled_ds_config(dict(d.ds_config), args, d.ranks.world // d.sequence_parallel,
                              AutoConfig.from_pretrained(s.model, trust_remote_code=s.trust_remote_code),
                              max(s.max_steps, 1), {"bf16": spec.bf16})
    shown = facts.machine
    click.echo(json.dumps({"machine": {"gpus": len(shown.gpus), "gpu_memory_gib": round(shown.gpus[0].memory_bytes
                                       / GIB, 2) if shown.gpus else None, "described": named is not None},
                           "settings": s.to_dict(), "decision": d.resolved(), "reasons": dict(d.reasons),
                           "data": d.data.to_dict() if d.data else None, "ranks": d.ranks.world,
                           "trainer": spec.trainer, "deepspeed": filled}, indent=2, default=str))


def env_file(folder: str | None) -> None:
    """The settings as an env file that reproduces them: a job's, from the settings.json it wrote in its output
    folder at its start (so a running job's too), or else this environment's (SFT_CONFIG's file included)."""
    from ..settings import files

    if folder is None:
        s, problems = prepare.settings()
        if problems:
            refuse("settings are", problems)
        click.echo(files.env_file(s, "the settings of this environment" + (f" and {s.config}" if s.config else "")),
                   nl=False)
        return
    path = Path(folder) / "run" / "settings.json"
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        fail(f"{folder}: cannot read {path} ({getattr(e, 'strerror', None) or e}): expected the output folder of a "
             "job that started (it writes run/settings.json at its start)", exitcodes.BAD_SETTINGS)
    known = {f.name for f in dataclasses.fields(Settings)}
    s = Settings(**{k: v for k, v in recorded.items() if k in known})  # a later version's own settings: left out
    click.echo(files.env_file(s, f"the settings of the job in {folder} ({path})"), nl=False)


def data(rows: int, per_token: bool, of_eval: bool) -> None:
    """The data checked as the job checks it, then its first rows as tokenised, the loss-carrying tokens marked."""
    from ..data import DataError, show
    from ..data.tokens import Labeller
    from ..planner import data as data_rules
    from . import data as data_step

    deepspeed_quiet()  # before the checks, which may import DeepSpeed
    s, ranks = checked(inputs.DATA)
    deepspeed_logs_to_stderr()
    try:
        found = data_step.read(s, ranks)
    except DataError as e:
        refuse("data is", e.problems)
    click.echo("\n".join(found.notes))
    _, why = data_rules.loss_mode(s.loss_on, found.facts)
    click.echo(f"loss on: {why}")
    shown = found.eval if of_eval else found.train
    if shown is None:
        raise click.UsageError("no evaluation rows: set SFT_EVAL_DATASET, SFT_EVAL_SPLIT or SFT_EVAL_FRACTION")
    if rows:  # TRL's tokenisation of no rows fails (StopIteration): --rows 0 asks for the checks alone
        labeller = Labeller(found.tokenizer, found.loss_on, s.max_length, s.extra_trainer_args)
        click.echo(show.render(shown, labeller, rows, s.packing, per_token))


def plan(asked: dict[str, Any], gpus: int | None, gpu_memory: float | None, nnodes: int, host_memory: float | None,
         as_json: bool) -> None:
    """Memory per GPU for every ZeRO option, and the decision, for this machine or the one the options describe."""
    from ..planner.plan import format_table

    deepspeed_logs_to_stderr()
    s, problems = prepare.settings()  # the ranks are those of the machine the options describe, below
    if asked["model"] is not None:  # in SFT_MODEL's place: checked as it is
        problems += model_problems("--model", asked["model"])
    if problems := problems + inputs.problems(s, inputs.DECIDING):
        refuse("settings are", problems)
    facts = machine.measure(s.output_dir)
    found = facts.machine
    if not found.gpus and (gpus is None or gpu_memory is None):
        raise click.UsageError("no GPU here: give --gpus N and --gpu-memory GIB (e.g. --gpus 8 --gpu-memory 79.25)")
    if (named := described(gpus, gpu_memory, found.gpus)) is not None:
        found = replace(found, gpus=named)
    found = replace(found, nodes=nnodes, **({"host_memory_bytes": round(host_memory * GIB)} if host_memory else {}))
    s = replace(s, **{k: v for k, v in asked.items() if v is not None})
    ranks, problems = prepare.ranks(s, found)
    if problems or ranks is None:
        fail(problems[0], exitcodes.BAD_SETTINGS)
    try:
        d = prepare.prepare(s, replace(facts, machine=found), ranks, read_data=False).decision
        p, explained, refused = d.plan, d.explain(), None
    except CannotRun as e:  # where nothing fits, the plan still says why, option by option
        if e.plan is None:
            fail(str(e), e.exit_code)
        p, explained, d, refused = e.plan, "  none: no ZeRO option fits this machine (why: below)", None, e
    if as_json:
        click.echo(json.dumps({**p.to_dict(), "decision": d.resolved() if d else None,
                               **({"refused": str(refused)} if refused else {})}, indent=2))
    else:
        click.echo(format_table(p) + "\n\ndecided:\n" + explained)
    if refused:  # as `run` and `config` end where nothing fits: exit 3, the reason on stderr
        fail(str(refused), refused.exit_code)


def doctor() -> None:
    """This machine's checks for the job, against the needs of the run the settings describe where they are known."""
    from . import preflight

    s, ranks = checked(inputs.DECIDING, reads_data=False)
    facts = machine.measure(s.output_dir)
    try:
        given = prepare.prepare(s, facts, ranks, read_data=False)
        d = given.decision
        needs = preflight.Needs.of(d, given.inputs.shape.total_params, s.save_total_limit, s.extra_trainer_args,
                                   end_saves=disk.end_checkpoint(s.save_steps is not None))
        facts = machine.measure_links(facts, d.ranks)
        click.echo(f"for {s.model} with {d.stage.label} on {d.ranks.world} rank(s):")
    except CannotRun as e:
        click.echo(f"the run's needs are unknown ({e}); checking the machine alone:")
        needs = preflight.Needs()
    results = preflight.run(facts, needs)
    click.echo(preflight.format_checks(results))
    sys.exit(exitcodes.PREFLIGHT if preflight.failed(results) else exitcodes.DONE)


def status(target: str, revision: str | None, as_json: bool) -> None:
    """Where a run is, from its output folder or its Hub repo (read only)."""
    from . import status as run_status

    target = target or os.environ.get("SFT_OUTPUT_DIR", "output")
    if Path(target).expanduser().is_dir():
        found = run_status.of_folder(Path(target).expanduser())
    elif (why := run_status.not_a_target(target)) is None:
        found = _repo_status(target, revision)
    else:  # before: a file, or a path not there, was sent to the Hub, and said as the Hub not answering (exit 10)
        fail(why, exitcodes.BAD_SETTINGS)
    click.echo(found.to_json() if as_json else found.text())


def status_check(target: str, stalled_after_s: float) -> int:
    """`status --check`: one line, and the check's exit code (status.py: HEALTHY, STALLED, ENDED_NOT_DONE, NO_RUN)."""
    from . import status as run_status

    folder = Path(target or os.environ.get("SFT_OUTPUT_DIR", "output"))
    if not folder.is_dir():
        click.echo(f"{folder}: no such output folder: no run here")
        return run_status.NO_RUN
    code, line = run_status.check(folder, stalled_after_s)
    click.echo(line)
    return code


def _repo_status(repo_id: str, revision: str | None):
    from ..hub.errors import http_status, short_error
    from . import status as run_status

    try:
        return run_status.of_repo(repo_id, revision)
    except Exception as e:  # noqa: BLE001 - one line naming the repo, not the client's traceback
        fail(f"cannot read {repo_id} from the Hub ({short_error(e)}): check the name, and a token that can read it "
             "(HF_TOKEN or `hf auth login`)", exitcodes.HUB_AUTH if http_status(e) in (401, 403, 404)
             else exitcodes.HUB_UNREACHABLE)


def export(checkpoint: str, out: str) -> None:
    """Full fp32 weights from a checkpoint-N folder, via DeepSpeed's zero_to_fp32."""
    from . import export as exporter

    try:
        exporter.export(checkpoint, out)
    except exporter.NotACheckpoint as e:
        fail(str(e), exitcodes.BAD_SETTINGS)
    click.echo(f"wrote fp32 weights to {out}")


def job(probe_only: bool) -> int:
    """`run` and `probe`: the job, with what runs best from the process's start begun before the settings' inputs
    are read, and stopped if they are refused: FlashAttention-4's import check (machine.early_import_check says
    why) and, where the settings themselves are valid, the ranks (standby.py)."""
    from ..version import version
    from . import job as recipe
    from . import preflight, standby

    s, problems = prepare.settings()  # the nodes' variables among them
    tracking.hide(tracking.unused(s.report_to, s.ds_config))  # before any library imports them (tracking.py)
    check = machine.early_import_check(s.attention)
    gpus = machine.gpus()
    driver = preflight.check_driver(*machine.driver_facts(gpus), len(gpus), version())
    if driver.status == preflight.FAIL:  # before any rank: with no GPU torch can use, each would fail or train on CPU
        if check is not None:
            check.cancel()
        fail(driver.message, exitcodes.PREFLIGHT)
    where = nodes.from_env(os.environ) if not problems else nodes.Nodes()
    ranks, refused = prepare.ranks(s, Machine(gpus=gpus, nodes=where.nnodes))
    problems += refused
    waiting = standby.start(s, ranks, where, gpus) if not problems and ranks else None  # inputs checked meanwhile
    problems += inputs.problems(s, inputs.JOB)
    if problems or ranks is None:
        if check is not None:
            check.cancel()
        if waiting is not None:
            waiting.end()
        refuse_settings(s, problems)
    return recipe.run(s, ranks, gpus, check, waiting, probe_only=probe_only)
