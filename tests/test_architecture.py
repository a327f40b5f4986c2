"""The shape of the code, kept by a test rather than by memory (docs/how-it-works.md, "Where the code is").

Read from the source with `ast`, every import counted: at the top of a module, inside a function and under
TYPE_CHECKING alike, since each is a dependency a reader has to follow.

- No import cycle.
- The layers: each package may import its own layer and the layers below it, never one above.
    bottom      settings (one package: fields, parsing, checks), units and the other small modules that import
                nothing of the job's
    records     what crosses a process or a restart: handoff/, events, checkpoints
    data        the user's data: sources, shapes, checks, tokens
    planner     the decision, pure: no file, clock, process or GPU is read there
    hub         the Hub protocol
    top         controller/ (the container's main process), ranks/ (what every rank runs) and entrypoint.py;
                neither of controller/ and ranks/ imports the other
  dev/ (profiler, fault injection) is dev-only: no module of the job imports it.
- Size: no module over 350 lines and no function over 50, unless ALLOWED below says why.
- No dated measurement in a docstring or comment: the code says why, docs/ keeps the figures (docs/speed.md).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS = (  # lowest first
    ("bottom", ("sft.settings", "sft.units", "sft.exitcodes", "sft.console", "sft.lifeline", "sft.stages",
                "sft.nodes", "sft.tracking", "sft.version")),
    ("records", ("sft.handoff", "sft.events", "sft.checkpoints")),
    ("data", ("sft.data",)),
    ("planner", ("sft.planner",)),
    ("hub", ("sft.hub",)),
    ("top", ("sft.controller", "sft.ranks", "entrypoint")),
)
APART = (("sft.controller", "sft.ranks"),)  # of one layer, and neither imports the other
DEV = "sft.dev"  # dev-only tools: never imported by the job (the ranks load it by name when SFTDEV_/SFTTEST_ ask)
# What the planner may not import: it decides from what the controller measured and read, and reads nothing itself
IMPURE = {"os", "sys", "time", "subprocess", "shutil", "socket", "signal", "fcntl", "tempfile", "threading",
          "multiprocessing", "pathlib", "torch", "transformers", "datasets", "huggingface_hub", "trl", "accelerate"}
MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 50
ALLOWED: dict[str, str] = {  # "path" or "path::function": why it may be longer
    "sft/ranks/patches/zero_step.py::zero_step_in_one_pass": "DeepSpeed 0.19.8's ZeRO-1/2 step restated line for "
    "line, for the one case it serves: read beside DeepSpeed's own, it must stay whole",
    "sft/ranks/patches/reads.py::trainer_class": "TRL's SFTTrainer subclassed inside a function, so that only the "
    "ranks import TRL; each method of the class is short",
    "sft/dev/timeline.py::gaps_report": "a developer's report, one pass over one trace (dev-only)",
    "sft/dev/timeline.py::light_report": "a developer's report, one pass over one trace (dev-only)",
}


def _modules() -> dict[str, Path]:
    found = {"entrypoint": ROOT / "entrypoint.py"}
    for path in sorted((ROOT / "sft").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of the job that `name` imports, anywhere in its file (the nearest module for `from x import y`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _external(path: Path) -> set[str]:
    """The top-level names of everything outside the job that a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"sft"}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _layer(name: str) -> int | None:
    return next((i for i, (_, packages) in enumerate(LAYERS) if any(_within(name, p) for p in packages)), None)


def test_every_module_of_the_job_has_a_layer():
    assert [n for n in MODULES if _layer(n) is None and not _within(n, DEV) and n != "sft"] == []


def test_no_import_cycle():
    """Tarjan's strongly connected components: any of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})" for a, targets in GRAPH.items()
              for b in targets if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)]
    assert upward == []


def test_controller_and_ranks_never_import_each_other():
    crossed = [f"{a} imports {b}" for a, targets in GRAPH.items() for b in targets for x, y in APART
               if (_within(a, x) and _within(b, y)) or (_within(a, y) and _within(b, x))]
    assert crossed == []


def test_the_job_never_imports_the_dev_tools():
    found = [f"{a} imports {b}" for a, targets in GRAPH.items() for b in targets
             if _within(b, DEV) and not _within(a, DEV)]
    assert found == []


def test_the_planner_reads_nothing_itself():
    found = {name: sorted(_external(path) & IMPURE) for name, path in MODULES.items() if _within(name, "sft.planner")}
    assert {name: bad for name, bad in found.items() if bad} == {}


def _too_long() -> list[str]:
    found = []
    for name, path in MODULES.items():
        where = str(path.relative_to(ROOT))
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where} ({lines} lines)")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{where}::{node.name} ({length} lines)")
    return found


def test_no_module_or_function_too_long_without_a_reason():
    assert [f for f in _too_long() if f.split(" (")[0] not in ALLOWED] == []


@pytest.mark.parametrize("entry", sorted(ALLOWED))
def test_each_allowance_is_still_needed(entry):
    """An allowance whose module or function has come back under its limit, or is gone, is removed."""
    assert entry in [f.split(" (")[0] for f in _too_long()]


def test_the_rank_program_loads_the_dev_tools_only_when_asked(tmp_path):
    """The seam (sft/ranks/devtools.py) imports sft/dev/ by name, which the static checks above cannot see: a rank
    of a user's job, with no SFTDEV_ or SFTTEST_ variable, never loads it."""
    import os
    import subprocess
    import sys

    code = ("import sys\nimport sft.ranks.train\nfrom sft.ranks import devtools\n"
            "print(devtools.load() is not None, 'sft.dev' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SFTDEV_", "SFTTEST_"))}
    for extra, expected in (({}, "False False"), ({"SFTTEST_STEP_SECONDS": "0"}, "True True")):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, **extra}, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split("\n")[-2] == expected, out.stdout


DATE = re.compile(r"20\d\d-\d\d-\d\d(?!T)")  # a date, not an ISO timestamp's example ('2026-12-01T18:00:00Z')


def _docstrings_and_comments(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line of a docstring (module, class, function) and of every `#` comment."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                found += [(node.body[0].lineno + i, line) for i, line in enumerate(text.split("\n"))]
    found += [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
              if token.type == tokenize.COMMENT]
    return found


def test_no_docstring_or_comment_carries_a_measurement_date():
    """Code comments say why; a dated figure belongs in docs/ (docs/speed.md, the journal of measurements), where
    the comment points. The strings the program prints are not read here."""
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in MODULES.values()
             for number, line in _docstrings_and_comments(path) if DATE.search(line)]
    assert found == []
