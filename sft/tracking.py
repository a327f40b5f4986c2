"""Experiment trackers (SFT_REPORT_TO): which ones, whether this image has them, and where they write.

The Trainer's own integrations do the logging (report_to); this module only checks the names up front and
points each tracker's local files into OUTPUT/run/, so they stay with the run (and a restart appends to them).
Their secrets (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...) are read by the trackers from the environment, as
HF_TOKEN is: the job never writes them anywhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# name -> the module the Trainer's integration imports
TRACKERS = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow"}
IN_IMAGE = ("tensorboard", "trackio")
# Folders under OUTPUT/run/, and the variable through which each tracker is told (a user's own value wins).
FOLDERS = {"tensorboard": ("TENSORBOARD_LOGGING_DIR", "tensorboard"), "trackio": ("TRACKIO_DIR", "trackio"),
           "wandb": ("WANDB_DIR", "wandb")}


def describe() -> str:
    """The trackers as the settings' help names them (docs/settings.md): what the image has, where their logs go."""
    has, lacks = [n for n in TRACKERS if n in IN_IMAGE], [n for n in TRACKERS if n not in IN_IMAGE]
    folders = " and ".join(f"OUTPUT/run/{FOLDERS[n][1]}" for n in has if n in FOLDERS)
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
            out.append(f"{name} is not installed in this image (it has {' and '.join(IN_IMAGE)}): build your own "
                       f"on it with `RUN /opt/venv/bin/pip install {name}`" + (
                           ", and set WANDB_MODE=offline to keep its logs local" if name == "wandb" else ""))
    return out


def environment(value: str, run_dir: Path) -> dict[str, str]:
    """Variables for the ranks: each chosen tracker's local folder under `run_dir`."""
    env = {}
    for name in names(value):
        if name in FOLDERS:
            variable, folder = FOLDERS[name]
            env[variable] = str(Path(run_dir) / folder)
    if "mlflow" in names(value):
        env["MLFLOW_TRACKING_URI"] = (Path(run_dir) / "mlruns").absolute().as_uri()
    return env
