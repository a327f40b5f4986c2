"""docs/host.md is what scripts/host_table.py writes (`make docs`): the drivers of the image's CUDA lines from the
preflight's own table, disk and host RAM per model size from the planner's figures."""

from __future__ import annotations

import importlib.util

from conftest import REPO


def _generator():
    spec = importlib.util.spec_from_file_location("host_table", REPO / "scripts" / "host_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_host_md_is_the_generators_output():
    written = _generator().render()
    assert (REPO / "docs" / "host.md").read_text() == written, "docs/host.md is stale: run `make docs`"


def test_the_table_counts_parameters_as_the_job_does_and_sizes_disk_as_the_preflight_does():
    """Qwen3-8B: the parameters the planner's tests know (8,190,735,360), and its disk at ZeRO-3: three checkpoints
    of 14 bytes/param (the seed's 'about 115 GB' each) and the cached base model at 2 bytes/param (final/ is
    links to the last checkpoint's files)."""
    row = next(line for line in _generator().sizes().splitlines() if line.startswith("| Qwen3-8B |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "8.19 B"
    assert cells[2] == f"{round((3 * 14 + 2) * 8_190_735_360 / 1e9):,} GB"


def test_the_readmes_summary_quotes_the_table():
    """The README's five lines name Qwen3-8B's disk at ZeRO-3 and its host RAM with `3-offload` from docs/host.md."""
    row = next(line for line in _generator().sizes().splitlines() if line.startswith("| Qwen3-8B |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    readme = (REPO / "README.md").read_text()
    assert f"Qwen3-8B at ZeRO-3: {cells[2]} under `/data`" in readme
    assert f"Qwen3-8B with `3-offload` about {cells[5]} per node" in readme  # after the 8-bit disk column
