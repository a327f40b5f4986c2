"""docs/how-it-works.md's newcomer test, made: each change it names is made in a copy of the job, touching only the
files the page says, and the job then does what the change asked (through the real entrypoint)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEMO_DATA, DEMO_MODEL, clean_environ

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("entrypoint.py", "sft", "ds_configs", "docs/settings.md", "scripts/settings_table.py")


@pytest.fixture
def copy(tmp_path) -> Path:
    """The job's code, copied: what a change touches is what differs from the original afterwards."""
    for name in COPIED:
        source, target = ROOT / name, tmp_path / "job" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path / "job"


def edit(path: Path, after: str, text: str) -> None:
    """Insert `text` after the line holding `after` (which must appear once)."""
    source = path.read_text()
    assert source.count(after) == 1, after
    at = source.index("\n", source.index(after)) + 1
    path.write_text(source[:at] + text + source[at:])


def changed(copy: Path) -> list[str]:
    """The files of the copy whose text differs from the original's."""
    found = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        original = ROOT / path.relative_to(copy)
        if not original.is_file() or original.read_bytes() != path.read_bytes():
            found.append(str(path.relative_to(copy)))
    return found


def config(copy: Path, tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    env = clean_environ(tmp_path)
    env.update(SFT_MODEL=str(DEMO_MODEL), SFT_DATASET=str(DEMO_DATA), SFT_OUTPUT_DIR=str(tmp_path / "out"), **settings)
    return subprocess.run([sys.executable, "entrypoint.py", "config"], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_setting_that_reaches_the_trainer_is_two_files_and_the_generated_table(copy, tmp_path):
    """SFT_WEIGHT_DECAY, as a newcomer would add it: its field (sft/settings/fields.py), its line in the Trainer's
    arguments (sft/planner/arguments.py), then `make docs` for docs/settings.md."""
    edit(copy / "sft/settings/fields.py", 'learning_rate: float = _setting(',
         '    weight_decay: float = _setting(0.0, "AdamW\'s weight decay.", min=0)\n')
    edit(copy / "sft/planner/arguments.py", 'Argument("learning_rate", "SFT_LEARNING_RATE"',
         '    Argument("weight_decay", "SFT_WEIGHT_DECAY", lambda r: r.settings.weight_decay),\n')
    subprocess.run([sys.executable, "scripts/settings_table.py"], cwd=copy, check=True, timeout=120)
    assert changed(copy) == ["docs/settings.md", "sft/planner/arguments.py", "sft/settings/fields.py"]
    assert "| `SFT_WEIGHT_DECAY` | `0.0` | AdamW's weight decay. |" in (copy / "docs/settings.md").read_text()
    result = config(copy, tmp_path, SFT_WEIGHT_DECAY="0.1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["trainer"]["weight_decay"] == 0.1
    refused = config(copy, tmp_path, SFT_TRAINER_ARGS='{"weight_decay": 0.2}', SFT_WEIGHT_DECAY="x")
    assert refused.returncode == 2
    assert "SFT_WEIGHT_DECAY='x': expected a number" in refused.stderr
    assert "weight_decay is set by the job: use SFT_WEIGHT_DECAY" in refused.stderr


def test_a_new_tracker_is_one_file(copy, tmp_path):
    """ClearML, as a newcomer would add it: one line in sft/tracking.py's table (the Trainer's own integration does
    the logging); `make docs` writes the settings' help. Here a stand-in package plays ClearML being installed."""
    source = (copy / "sft/tracking.py").read_text()
    assert source.count('"mlflow": "mlflow"}') == 1
    (copy / "sft/tracking.py").write_text(source.replace('"mlflow": "mlflow"}', '"mlflow": "mlflow", "clearml": "clearml"}'))
    assert changed(copy) == ["sft/tracking.py"]
    subprocess.run([sys.executable, "scripts/settings_table.py"], cwd=copy, check=True, timeout=120)
    assert "; clearml (not in the image: add them to your own)" in (copy / "docs/settings.md").read_text()
    refused = config(copy, tmp_path, SFT_REPORT_TO="clearml")
    assert refused.returncode == 2 and "clearml is not installed in this image" in refused.stderr
    (tmp_path / "site" / "clearml").mkdir(parents=True)
    (tmp_path / "site" / "clearml" / "__init__.py").write_text("")
    result = config(copy, tmp_path, SFT_REPORT_TO="clearml", PYTHONPATH=str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["trainer"]["report_to"] == ["clearml"]


def test_the_stage_is_chosen_in_one_place():
    """How the stage is chosen when the model barely fits is one file's: planner/decide.py::_first_stage tries
    stages.preference(world) in order and takes the first whose planned peak fits; the plan only estimates."""
    readers = []
    for path in sorted((ROOT / "sft").rglob("*.py")):
        names = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        if names & {"PREFERENCE", "preference"}:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == ["sft/planner/decide.py"]
    plan = (ROOT / "sft/planner/plan.py").read_text()
    assert "PREFERENCE" not in plan and "preference" not in plan and "choice" not in plan
