"""The end's summary and loss plot (sft/controller/summary.py::write, output.py::plot_loss): the summary is the run's
record and is written whatever the plot meets; the plot's library, loaded while the ranks train (plot_ahead), draws
the same picture when the end comes before that load is done."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from sft.controller import summary
from sft.controller.output import Paths
from sft.handoff import Summary

HISTORY = [{"step": s, "loss": 2.0 / s} for s in range(1, 6)] + [{"step": 5, "eval_loss": 0.5}]


def test_a_plot_that_fails_leaves_the_summary_written_and_says_so(tmp_path, monkeypatch, capsys):
    """Before: an error of the plot's own (its library missing, a figure it could not draw) was raised out of the
    job's end, which then wrote no summary and exited 1 after a finished training."""
    def broken(*args, **kwargs):
        raise RuntimeError("no figure today")

    monkeypatch.setattr(summary, "plot_loss", broken)
    paths = Paths(tmp_path / "out")
    summary.write(Summary(status="done", exit_code=0, train={"log_history": HISTORY}), paths, "tiny")
    assert json.loads(paths.summary.read_text())["status"] == "done"
    assert not (paths.run / "loss.png").exists()
    assert f"warning: no loss plot (RuntimeError: no figure today); the losses are in {paths.summary}" \
        in capsys.readouterr().out


DRAWN_AT_ONCE = """
import sys
from pathlib import Path
from sft.controller import output, summary
from sft.handoff import Summary

output.plot_ahead()  # its import still under way as the end draws: the end's import waits for it
paths = output.Paths(Path(sys.argv[1]))
paths.run.mkdir(parents=True)  # as the job's start made it
summary.write(Summary(status="done", exit_code=0, train={"log_history": %r}), paths, "tiny")
""" % (HISTORY,)


def test_the_plot_is_drawn_while_its_library_is_still_loading_ahead(tmp_path):
    done = subprocess.run([sys.executable, "-c", DRAWN_AT_ONCE, str(tmp_path / "out")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "warning" not in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "out" / "run" / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "out" / "run" / "summary.json").is_file()
