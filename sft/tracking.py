"""Experiment trackers (SFT_REPORT_TO): which ones, whether this image has them, and where they write.

The Trainer's own integrations do the logging (report_to); this module only checks the names up front and
points each tracker's local files into OUTPUT/run/, so they stay with the run (and a restart appends to them).
A restart also goes on in the same tracker run: rank 0 records the W&B and MLflow run ids in OUTPUT/run/trackers.json
once the trackers started, and the next start hands them back through the variables each tracker reads itself.
Their secrets (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...) are read by the trackers from the environment, as
HF_TOKEN is: the job never writes them anywhere.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

# name -> the module the Trainer's integration imports
TRACKERS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow"}
IN_IMAGE = ("tensorboard", "trackio", "wandb", "mlflow")  # mlflow as mlflow-skinny: the client, no server or UI
# Folders under OUTPUT/run/, and the variable through which each tracker is told (a user's own value wins).
FOLDERS = {"tensorboard": ("TENSORBOARD_LOGGING_DIR", "tensorboard"), "trackio": ("TRACKIO_DIR", "trackio"),
           "wandb": ("WANDB_DIR", "wandb")}
MLRUNS = "mlruns"  # MLflow's local file store under OUTPUT/run/, told as a file:// MLFLOW_TRACKING_URI


# Trackers that libraries import as they are imported themselves, used or not: transformers' is_wandb_available()
# imports wandb (TRL calls it at its import), DeepSpeed's autotuner imports mlflow (at `import deepspeed`). Each costs
# every process of the job, the controller and each rank, a second or more of its start (docs/benchmarks.md). Those
# the run does not name are made absent instead, the way Python itself marks a module it has not
# (sys.modules[name] = None: find_spec answers None and import raises ModuleNotFoundError), so those checks answer
# "not installed". Not where the user brings a DeepSpeed config: its monitor section may name them. Remove when
# transformers checks for wandb without importing it and DeepSpeed imports mlflow only when autotuning.
IMPORTED_REGARDLESS = ("wandb", "mlflow")
UNUSED_VARIABLE = "SFTJOB_UNUSED_TRACKERS"  # the ranks' copy of `unused`, set by the controller (launch.environment)


def unused(report_to: str, ds_config: str | None) -> list[str]:
    """The trackers a run with these settings never uses, of those libraries import regardless."""
    chosen = names(report_to)
    return [] if ds_config else [n for n in IMPORTED_REGARDLESS if n not in chosen]


def hide(unused_names: Iterable[str]) -> None:
    """Make these trackers absent in this process (`unused`). One already imported stays."""
    for name in unused_names:
        if name in IMPORTED_REGARDLESS and name not in sys.modules:
            sys.modules[name] = None


def describe() -> str:
    """The trackers as the settings' help names them (docs/settings.md): what the image has, where their logs go."""
    has, lacks = [n for n in TRACKERS if n in IN_IMAGE], [n for n in TRACKERS if n not in IN_IMAGE]
    folders = ", ".join(f"OUTPUT/run/{FOLDERS[n][1] if n in FOLDERS else MLRUNS}" for n in has
                        if n in FOLDERS or n == "mlflow")
    text = f"{' or '.join(has)} (in the image; their logs go to {folders})"
    return text + (f"; {' or '.join(lacks)} (not in the image: add them to your own)" if lacks else "")


def names(value: str) -> list[str]:
    """SFT_REPORT_TO as the Trainer's report_to list ([] for none)."""
    found = [n.strip().lower() for n in value.split(",") if n.strip()]
    return [] if found == ["none"] else found


def problems(value: str) -> list[str]:
    """What is wrong with SFT_REPORT_TO: unknown names, none mixed with others, trackers not installed here."""
    found = [n.strip().lower() for n in value.split(",") if n.strip()]
    if not found:
        return ["expected none, or trackers such as tensorboard,trackio"]
    if "none" in found:
        return [] if found == ["none"] else ["none cannot be listed with trackers"]
    out = []
    for name in found:
        if name not in TRACKERS:
            out.append(f"{name}: unknown tracker (expected {', '.join(TRACKERS)})")
        elif importlib.util.find_spec(TRACKERS[name]) is None:
            out.append(f"{name} is not installed in this image (it has {', '.join(IN_IMAGE)}): build your own "
                       f"on it with `RUN /opt/venv/bin/pip install {name}`" + (
                           ", and set WANDB_MODE=offline to keep its logs local" if name == "wandb" else ""))
    return out


def environment(value: str, run_dir: Path) -> dict[str, str]:
    """Variables for the ranks (a user's own value of each wins): each chosen tracker's local folder under
    `run_dir`, and the run an earlier start of this job logged to, to go on in."""
    env, chosen, runs = {}, names(value), TrackerRuns.load(Path(run_dir))
    for name in chosen:
        if name in FOLDERS:
            variable, folder = FOLDERS[name]
            env[variable] = str(Path(run_dir) / folder)
    if "wandb" in chosen and runs.wandb:
        env.update(WANDB_RUN_ID=runs.wandb, WANDB_RESUME="allow")  # allow: the run may be new to the server
    if "mlflow" in chosen:
        env["MLFLOW_TRACKING_URI"] = (Path(run_dir) / MLRUNS).absolute().as_uri()
        # MLflow 3 refuses its file store unless asked: it keeps the run beside the output, no database needed
        env["MLFLOW_ALLOW_FILE_STORE"] = "true"
        if runs.mlflow:
            env["MLFLOW_RUN_ID"] = runs.mlflow  # MLflowCallback (and mlflow.start_run) reattach to it
    return env


@dataclasses.dataclass(frozen=True)
class TrackerRuns:
    """The tracker runs this job logs to, kept across restarts in OUTPUT/run/trackers.json (ids only: no key)."""

    wandb: str | None = None
    mlflow: str | None = None
    FILE = "trackers.json"

    @classmethod
    def load(cls, run_dir: Path) -> TrackerRuns:
        path = Path(run_dir) / cls.FILE
        if not path.is_file():
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(path.read_text()).items() if k in known and isinstance(v, str)})

    def save(self, run_dir: Path) -> None:
        path = Path(run_dir) / self.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        os.replace(path.with_suffix(".tmp"), path)  # whole or not at all: a restart reads it
