"""A fuzzing harness over every input of the job's checking step (issue 46): generated values for every SFT_ setting,
generated data files, chat templates and Hub names (tests/fuzzing.py), driven through the real checking functions in
this process (prepare.checked, the decision, the data step) and, for a handful, through the real entrypoint.

The invariant, for every case: the outcome is one of the exit codes' table (the checks' problems are exit 2, a
CannotRun carries its code); every problem names the input it is about (it starts with the variable) and says what
would be right; no exception escapes (a traceback is exit 1, "unexpected"); nothing is written on exit 2.

CI runs a bounded number of examples (each group's time printed at the end of the run); FUZZ_EXAMPLES=N runs N per
group (the default is small), FUZZ_SEED=S another draw (the default is fixed, so CI is repeatable). A failure prints
its seed and case; once fixed, the case stays below as a plain regression test.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest

import conftest
import fuzzing
from conftest import DEMO_MODEL, demo_env, run_entrypoint
from sft import exitcodes
from sft.controller import data as data_step
from sft.controller import inputs, machine, prepare
from sft.data import DataError
from sft.planner.inputs import CannotRun, Ranks
from sft.settings import Settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or None  # None: each group's default below
SEED = int(os.environ.get("FUZZ_SEED", "46"))
CODES = {code for code, _, _ in exitcodes.meanings()}
NAMED = re.compile(r"^(SFT_[A-Z0-9_]+|HF_[A-Z_]+)[=:' ]")  # a problem starts with the variable it is about


def count(default: int) -> int:
    return EXAMPLES or default


def timed(group: str, examples: int, began: float) -> None:
    conftest.FUZZ_REPORT.append(f"fuzz {group}: {examples} examples in {time.monotonic() - began:.1f} s "
                                f"(FUZZ_SEED={SEED}; FUZZ_EXAMPLES=N for more)")


def assert_named(problems: list[str], case) -> None:
    assert problems, case
    for problem in problems:
        assert NAMED.match(problem), f"a problem that names no input: {problem!r} ({case})"
        assert len(problem.split(": ", 1)[-1]) > 10, f"a problem that says not what would be right: {problem!r}"


def check_settings(env: dict[str, str], facts, read_data: bool) -> int:
    """The checking step on `env`, as every command runs it: its exit code."""
    found = prepare.checked(inputs.JOB, gpus=(), environ=env)
    if found.problems or found.ranks is None:
        assert_named(found.problems, env)
        return exitcodes.BAD_SETTINGS
    try:
        done = prepare.prepare(found.settings, facts, found.ranks, read_data=read_data)
        _config_of(found.settings, done.decision)
    except DataError as e:
        assert_named(e.problems, env)
        return exitcodes.BAD_SETTINGS
    except CannotRun as e:
        assert e.exit_code in CODES, (e, env)
        return e.exit_code
    return exitcodes.DONE


def _config_of(s: Settings, d) -> None:
    """What `config` prints of the decision: the Trainer's arguments made (no rank is started)."""
    from sft.controller.output import Paths
    from sft.controller.runs import make_spec

    make_spec(s, d, Paths(s.output_path), "train", s.output_path, s.max_steps).sft_config(in_rank=False)


def test_every_setting_with_generated_values(isolated_env, tmp_path):
    rng, began, n = random.Random(SEED), time.monotonic(), count(120)
    facts = machine.measure(str(tmp_path))
    outcomes: dict[int, int] = {}
    for i in range(n):
        case = tmp_path / f"case-{i}"
        env = fuzzing.settings_case(rng, case)
        try:
            code = check_settings(env, facts, read_data=rng.random() < 0.05)
        except Exception as e:
            raise AssertionError(f"seed {SEED}, case {i}: {env}: {type(e).__name__}: {e}") from e
        outcomes[code] = outcomes.get(code, 0) + 1
        assert code in CODES
        assert not (case / "out").exists(), f"the check wrote its output folder ({env})"
    timed("settings", n, began)
    assert outcomes.get(exitcodes.BAD_SETTINGS) and outcomes.get(exitcodes.DONE), outcomes  # both kinds were drawn


def read(tmp_path: Path, **settings) -> int:
    """The data step, after the settings' own check of what SFT_DATASET says (a comma in a file's name splits it)."""
    from sft.settings import entries

    if problems := entries.problems("SFT_DATASET", settings["dataset"]):
        assert_named(problems, settings)
        return exitcodes.BAD_SETTINGS
    small = {"max_length": 64, "micro_batch": 1, "output_dir": str(tmp_path / "out"), **settings}
    try:
        data_step.read(Settings(model=str(DEMO_MODEL), **small), Ranks(1, ()))
    except DataError as e:
        assert_named(e.problems, settings)
        return exitcodes.BAD_SETTINGS
    return exitcodes.DONE


def test_generated_data_files(isolated_env, tmp_path):
    rng, began, n = random.Random(SEED + 1), time.monotonic(), count(40)
    for i in range(n):
        path, what = fuzzing.data_case(rng, tmp_path / f"data-{i}")
        policy = rng.choice([{}, {"empty_rows": "drop"}, {"long_rows": "drop"}, {"packing": False},
                             {"eval_fraction": 0.3}, {"loss_on": "assistant"}])
        before = sorted(p.name for p in path.parent.iterdir())
        try:
            read(tmp_path, dataset=str(path), **policy)
        except Exception as e:
            raise AssertionError(f"seed {SEED + 1}, case {i}: {what}, {policy}: {type(e).__name__}: {e}") from e
        assert sorted(p.name for p in path.parent.iterdir()) == before, "something was written beside the data"
    timed("data files", n, began)


def test_generated_chat_templates(isolated_env, tmp_path):
    rng, began, n = random.Random(SEED + 2), time.monotonic(), count(30)
    base = (DEMO_MODEL / "chat_template.jinja").read_text()
    for i in range(n):
        path = tmp_path / f"t{i}.jinja"
        path.write_text(fuzzing.template(rng, base))
        try:
            read(tmp_path, dataset="demo/chat.jsonl:24", chat_template=str(path))
        except Exception as e:
            raise AssertionError(f"seed {SEED + 2}, template {i}: {path.read_text()!r}: {type(e).__name__}: {e}") from e
    timed("chat templates", n, began)


def test_generated_hub_names(isolated_env):
    """A name is refused as a setting exactly where huggingface_hub's validator refuses it."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    rng, began, n = random.Random(SEED + 3), time.monotonic(), count(300)
    for _ in range(n):
        name = fuzzing.hub_name(rng).strip()  # a value's surrounding blanks are not part of it (settings/parse.py)
        if not name:
            continue
        problems = prepare.checked((), gpus=(), environ={"SFT_MODEL": str(DEMO_MODEL), "SFT_DATASET": "demo/chat.jsonl",
                                                         "SFT_HUB_REPO": name}).problems
        try:
            validate_repo_id(name)
            valid = "/" in name
        except HFValidationError:
            valid = False
        assert (problems == []) == valid, (name, problems)
        assert all(p.startswith(f"SFT_HUB_REPO={name!r}: expected a repo id") for p in problems), problems
    timed("hub names", n, began)


@pytest.mark.parametrize("kind", ["settings", "data", "template"])
def test_a_few_cases_through_the_real_entrypoint(tmp_path, kind):
    """The same invariant where the user meets it: the exit code, no traceback, nothing written on exit 2."""
    rng = random.Random(f"{SEED}-{kind}")
    env = demo_env(tmp_path, max_length=64, micro_batch=1)
    if kind == "settings":
        env.update({k: v for k, v in fuzzing.settings_case(rng, tmp_path).items() if "\x00" not in v})
        command = "config"
    elif kind == "data":
        env["SFT_DATASET"] = str(fuzzing.data_case(rng, tmp_path / "data")[0])
        command = "data"
    else:
        (tmp_path / "t.jinja").write_text(fuzzing.template(rng, (DEMO_MODEL / "chat_template.jinja").read_text()))
        env["SFT_CHAT_TEMPLATE"], command = str(tmp_path / "t.jinja"), "data"
    done = run_entrypoint(env, command, timeout=300)
    shown = done.stdout + done.stderr
    assert done.returncode in CODES and done.returncode != exitcodes.FAILED, shown[-3000:]
    assert "Traceback" not in shown, shown[-3000:]
    if done.returncode == exitcodes.BAD_SETTINGS:
        assert not (tmp_path / "out").exists()
        assert "error: the " in done.stderr


# --- what the harness found, each kept as a plain regression test

FOUND = [
    # floats: float() reads inf, nan and 1e999; the planner took them
    ({"SFT_LEARNING_RATE": "inf"}, "SFT_LEARNING_RATE='inf': expected a finite number"),
    ({"SFT_MAX_HOURS": "nan"}, "SFT_MAX_HOURS='nan': expected a finite number"),
    # a 400-digit micro-batch overflowed float() inside the memory plan (exit 1)
    ({"SFT_MICRO_BATCH": "1" * 400}, "SFT_MICRO_BATCH='" + "1" * 400 + "': expected at most 2147483647"),
    ({"SFT_TOKENS_PER_STEP": "9" * 30}, "expected at most 2147483647"),
    ({"SFT_MAX_LENGTH": "9" * 30}, "expected at most 2147483647"),
    # an output folder name longer than Linux takes: OSError ENAMETOOLONG from Path.exists (exit 1)
    ({"SFT_OUTPUT_DIR": "a" * 300}, "a folder name of 300 bytes: Linux takes at most 255"),
    # a NUL in a path: ValueError from os.stat (exit 1); only in-process (the environment cannot carry one)
    ({"SFT_DS_CONFIG": "\x00"}, "contains a NUL character"),
    # '~é' is the home of a user 'é': pathlib's expanduser raised RuntimeError (exit 1), os.path's leaves it be
    ({"SFT_DATASET": "~é/chat.jsonl"}, "SFT_DATASET='~é/chat.jsonl': no such file or folder"),
    # a data file's name longer than Linux takes: pathlib's exists raised ENAMETOOLONG (exit 1)
    ({"SFT_CHAT_TEMPLATE": "/tmp/" + "t" * 300 + ".jinja"}, "no such file or folder"),
    ({"SFT_DATASET": "/tmp/" + "d" * 300 + ".jsonl"}, "no such file or folder"),
]


FOUND_DATA = [
    # pyarrow's JSON reader crashed the process (segmentation fault, exit 139) on a first row that is null
    ("first-null.jsonl", b'null\n{"text": "a"}\n', "first-null.jsonl, line 1: a JSON null, not an object of columns"),
    ("first-null.json", b'\n  null\n', "first-null.json, line 2: a JSON null, not an object of columns"),
    # datasets said 'Instruction "train" corresponds to no data!' or "BatchSize must be greater than 0"
    ("empty.json", b"[]", "empty.json: no rows (an empty JSON array)"),
    ("header.csv", b"prompt,completion\n", "header.csv: no rows (a header line only)"),
    ("objects.jsonl", b"{}\n{}\n", "objects.jsonl: no row has a column (every line is {})"),
    ("mixed.json", b'[{"text": "a"}, 3]', "mixed.json: item 2 of its array is not an object of columns (a JSON int)"),
    # the JSON problem behind a UTF-8 mark, not "Unexpected UTF-8 BOM": datasets reads past the mark
    ("bom.json", b"\xef\xbb\xbf[\n]", "bom.json: no rows (an empty JSON array)"),
]


@pytest.mark.parametrize("name,content,message", FOUND_DATA)
def test_what_the_fuzzer_found_in_data_files(isolated_env, tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError) as e:
        data_step.read(Settings(model=str(DEMO_MODEL), dataset=str(tmp_path / name), output_dir=str(tmp_path / "o")),
                       Ranks(1, ()))
    assert any(message in p for p in e.value.problems), e.value.problems


def test_a_template_that_renders_no_token_is_named(isolated_env, tmp_path):
    """Found by the fuzzer: a template looping over a misspelt name rendered every row as nothing, and TRL's packing
    failed in pyarrow (ArrowNotImplementedError, exit 1)."""
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in mesages %}{{ m.content }}{% endfor %}")
    with pytest.raises(DataError) as e:
        data_step.read(Settings(model=str(DEMO_MODEL), dataset="demo/chat.jsonl:24", chat_template=str(path),
                                max_length=64, micro_batch=1, output_dir=str(tmp_path / "o")), Ranks(1, ()))
    assert e.value.problems == [f"SFT_CHAT_TEMPLATE={str(path)!r}: its chat template renders rows 1, 2, 3 and 21 more "
                                "of the training rows as no token at all, which teaches nothing: fix the template "
                                "(does it loop over messages?), or remove the rows"]


@pytest.mark.parametrize("env,message", FOUND)
def test_what_the_fuzzer_found(isolated_env, tmp_path, env, message):
    problems = prepare.checked(inputs.JOB, gpus=(), environ={"SFT_MODEL": str(DEMO_MODEL),
                                                             "SFT_DATASET": "demo/chat.jsonl",
                                                             "SFT_OUTPUT_DIR": str(tmp_path / "out"), **env}).problems
    assert any(message in p for p in problems), problems
    assert_named(problems, env)
