"""The end's summary and loss plot (sft/controller/summary.py::write, output.py::plot_loss): the summary is the run's
record and is written whatever the plot meets."""

from __future__ import annotations

import json

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

