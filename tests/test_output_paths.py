"""SFT_OUTPUT_DIR is the job's own folder (sft/settings/paths.py): never the root or a system folder, never a folder
the job reads from or one inside it, never one that holds what it reads. Each refused before anything is written."""

from __future__ import annotations

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, demo_env, run_entrypoint
from data_fixtures import rows, write
from sft.settings import SettingsError, from_env


def problems(**env) -> list[str]:
    try:
        from_env({f"SFT_{k.upper()}": str(v) for k, v in env.items()})
    except SettingsError as e:
        return e.problems
    return []


def test_an_output_folder_apart_from_the_inputs_is_taken(isolated_env, tmp_path):
    data = write(tmp_path / "data" / "train.jsonl", rows("messages", 8))
    assert problems(model=DEMO_MODEL, dataset=data, output_dir=tmp_path / "out") == []


@pytest.mark.parametrize("where", ["folder", "inside"])
def test_the_data_folder_or_one_inside_it_is_refused_as_output(isolated_env, tmp_path, where):
    folder = tmp_path / "data"
    write(folder / "train.jsonl", rows("messages", 8))
    out = folder if where == "folder" else folder / "out"
    (found,) = problems(model=DEMO_MODEL, dataset=folder, output_dir=out)
    verb = "is" if where == "folder" else "is inside"
    assert found == (f"SFT_OUTPUT_DIR={str(out)!r}: {verb} SFT_DATASET's folder {folder}: the job would write among "
                     "what it reads; give a folder of its own")


def test_an_output_folder_that_holds_the_data_or_the_model_is_refused(isolated_env, tmp_path):
    data = write(tmp_path / "out" / "train.jsonl", rows("messages", 8))
    model = tmp_path / "out" / "final"
    model.symlink_to(DEMO_MODEL, target_is_directory=True)  # a second fine-tune of the run's final model
    found = problems(model=model, dataset=data, output_dir=tmp_path / "out")
    assert len(found) == 2
    assert "holds SFT_MODEL's folder" in found[0] and "holds SFT_DATASET's file" in found[1]
    assert all("keep the inputs outside it, or give another SFT_OUTPUT_DIR" in p for p in found)


def test_the_model_folder_is_refused_as_output(isolated_env):
    (found,) = problems(model=DEMO_MODEL, dataset=DEMO_DATA, output_dir=DEMO_MODEL)
    assert found.startswith(f"SFT_OUTPUT_DIR={str(DEMO_MODEL)!r}: is SFT_MODEL's folder")


def test_a_link_into_the_system_folders_is_refused(isolated_env, tmp_path):
    (tmp_path / "etc").symlink_to("/etc", target_is_directory=True)
    (found,) = problems(model=DEMO_MODEL, dataset=DEMO_DATA, output_dir=tmp_path / "etc" / "sft")
    assert "/etc/sft is in the system's folders" in found


def test_the_real_entrypoint_refuses_the_data_folder_as_output_and_writes_nothing(tmp_path):
    """Issue 46: an output folder that was the dataset's folder started the ranks and failed inside them."""
    folder = tmp_path / "data"
    write(folder / "train.jsonl", rows("messages", 16))
    before = sorted(p.name for p in folder.iterdir())
    done = run_entrypoint(demo_env(tmp_path, dataset=folder, output_dir=folder, probe_steps=0), "run", timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout
    assert f"SFT_OUTPUT_DIR={str(folder)!r}: is SFT_DATASET's folder" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize("folder", ["/", "/proc", "/etc"])
def test_a_system_folder_as_data_is_refused_without_walking_it(isolated_env, tmp_path, folder):
    """Found by the fuzz harness (seed 46, case 94): SFT_EVAL_DATASET=/ walked the whole filesystem, and a /proc
    entry that vanished while listed came back as a FileNotFoundError traceback."""
    found = problems(eval_dataset=folder, output_dir=str(tmp_path / "out"))
    assert any(p.startswith(f"SFT_EVAL_DATASET='{folder}': ") and "is a system folder, not a dataset's" in p
               for p in found), found
