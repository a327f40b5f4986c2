"""What every command that needs a decision runs first, in one place: the settings and every problem with them,
then measure -> ranks -> data -> inputs -> decide. `run` and `probe` (job.py), `config`, `plan`, `doctor` and
`data` (entrypoint.py) all start here; only what they do with the result differs.

    checked(finders, gpus)    the settings, the ranks (chosen once, by the planner's rule) and every problem of the
                              settings, of the ranks on this machine and of what the finders read: exit 2 before
                              anything starts, each problem named (settings, ranks: its two first steps)
    prepare(s, facts, ranks)  the data read and checked, the decision's inputs read, the decision
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..planner import rules
from ..planner.decide import decide
from ..planner.decision import Decision
from ..planner.inputs import GPU, CannotRun, Inputs, Machine, Ranks
from ..settings import Settings, SettingsError, from_env
from . import data, inputs
from .machine import Facts


@dataclass(frozen=True)
class Checked:
    """The settings as given, the ranks they run on here (None: they cannot be chosen), and every problem."""

    settings: Settings
    ranks: Ranks | None
    problems: list[str]


def checked(finders: Sequence[inputs.Finder], gpus: tuple[GPU, ...], nodes: int = 1,
            environ: Mapping[str, str] | None = None) -> Checked:
    """Every problem at once: the settings' own (a value that does not parse keeps its default for what follows, so
    one typo hides nothing), the ranks' on these GPUs, and what the finders see of what the settings name."""
    s, problems = settings(environ)
    chosen, refused = ranks(s, Machine(gpus=gpus, nodes=nodes))
    return Checked(s, chosen, problems + refused + inputs.problems(s, finders))


def settings(environ: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """The settings and their own problems (a value that does not parse keeps its default)."""
    try:
        return from_env(environ), []
    except SettingsError as e:
        return e.settings, list(e.problems)


def ranks(s: Settings, machine: Machine) -> tuple[Ranks | None, list[str]]:
    """The ranks (the planner's rule, once a start) and what the decision's rules ask of this machine with them:
    SFT_GPUS names GPUs it has (on a machine with none it is ignored, and the decision's reason says so), bf16
    needs GPUs, and SFT_SEQUENCE_PARALLEL=N splits a node's ranks and the model's heads (what it asks of the other
    settings is the settings' own check)."""
    try:
        chosen = rules.choose_ranks(s, machine)
        rules.precision(s, chosen)
    except CannotRun as e:
        return None, [str(e)]
    if s.sequence_parallel in ("auto", 1):
        return chosen, []
    try:
        shape = inputs.shape_of(s.model, trust=s.trust_remote_code)
    except CannotRun:
        return chosen, []  # the model_config finder names it
    try:
        rules.check_split(s.sequence_parallel, chosen, shape)
    except CannotRun as e:
        return chosen, [str(e)]
    return chosen, []


@dataclass(frozen=True)
class Prepared:
    """What a command decides from, and the decision."""

    inputs: Inputs
    decision: Decision
    data: data.Found | None = None  # None: the command decides without the data (`plan`, `doctor`)


def prepare(s: Settings, facts: Facts, ranks: Ranks, *, read_data: bool = True, found: data.Found | None = None,
            resume: Path | None = None) -> Prepared:
    """The data (read and checked here, unless the job read it already, `found`, or the command needs none), the
    decision's inputs with the checkpoint a start resumes from, and the decision. Raises DataError listing every
    problem with the data, CannotRun with why no decision can run here."""
    if found is None and read_data:
        found = data.read(s, ranks)
    given = inputs.read(s, facts.machine, ranks, resume, found.facts if found else None)
    return Prepared(given, decide(given), found)

