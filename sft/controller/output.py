"""The output folder, as the controller writes it:

    OUTPUT/checkpoint-N/   the Trainer's checkpoints (DeepSpeed shards), the newest SFT_SAVE_TOTAL_LIMIT
    OUTPUT/final/          the 16-bit model, loadable by AutoModelForCausalLM.from_pretrained
    OUTPUT/run/            settings.json, ds_config.json, probe.json, summary.json, loss.png, reports/
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..handoff import RankReport, Summary


@dataclass(frozen=True)
class Paths:
    out: Path

    @property
    def run(self) -> Path:
        return self.out / "run"

    def clear_leftovers(self) -> None:
        """What an earlier start left that must not carry over: its stop file (it would stop this one), and the
        checkpoints it retired whose removal a kill cut off (their room is this start's)."""
        from ..checkpoints import remove_retired

        self.stop_file.unlink(missing_ok=True)
        remove_retired(self.out)

    @property
    def final(self) -> Path:
        return self.out / "final"

    @property
    def stop_file(self) -> Path:
        """Every rank polls it each step: its presence asks them to save and stop."""
        return self.run / "STOP"

    @property
    def verdict_file(self) -> Path:
        """The controller's Verdict to a training launch waiting after the probe's steps (handoff.Verdict)."""
        return self.run / "verdict.json"

    @property
    def attention_lock(self) -> Path:
        """Held by the process compiling FlashAttention-4's kernels while the ranks start (ranks/attention_ahead.py)."""
        return self.run / "attention-kernels.lock"

    @property
    def summary(self) -> Path:
        return self.run / "summary.json"

    @property
    def reports(self) -> Path:
        return self.run / "reports"

    def finished_settings(self) -> dict[str, Any] | None:
        """The settings of a complete earlier run in this folder; None when there is none."""
        done = Summary.load(self.summary)
        return done.settings if done and done.status == "done" and (self.final / "config.json").is_file() else None

    def rank_reports(self, mode: str) -> list[RankReport]:
        """The reports the ranks of the last `mode` run wrote, by rank."""
        found = [RankReport.load(p) for p in sorted(self.reports.glob(f"{mode}-rank*.json"))]
        return sorted((r for r in found if r is not None), key=lambda r: r.rank)

    def clear_reports(self, mode: str) -> None:
        """Reports of an earlier start would be mistaken for this one's."""
        for old in self.reports.glob(f"{mode}-rank*.json"):
            old.unlink()


def losses(log_history: list[dict[str, Any]], key: str = "loss") -> list[tuple[int, float]]:
    """(step, loss) pairs from the Trainer's log history (key "eval_loss": the evaluations')."""
    return [(e["step"], e[key]) for e in log_history if key in e and "step" in e]


def eval_results(log_history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last evaluation in the Trainer's log: its step, loss and token accuracy, and how many ran."""
    evals = [e for e in log_history if "eval_loss" in e]
    if not evals:
        return None
    last = evals[-1]
    return {"step": last.get("step"), "loss": last["eval_loss"], "mean_token_accuracy":
            last.get("eval_mean_token_accuracy"), "evaluations": len(evals)}


def plot_ahead() -> None:
    """matplotlib imported while the ranks train, in a thread of its own, so that the plot at the run's end only
    draws: its import (pyplot, its fonts) was the longest part of the end's work in this process. A daemon thread:
    the job never waits for it, and plot_loss's own import finds it done, waits for the rest, or fails there."""
    threading.Thread(target=_import_plotting, name="plot-import", daemon=True).start()


def _import_plotting() -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - plot_loss imports it again, and the summary's writing says why it fails
        pass


def plot_loss(points: list[tuple[int, float]], path: Path, title: str,
              eval_points: list[tuple[int, float]] | None = None) -> Path | None:
    """The loss curve as a PNG, the evaluations' loss beside it (matplotlib's Agg backend: no display needed)."""
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in points], [v for _, v in points], marker="." if len(points) < 50 else None,
            label="training")
    if eval_points:
        ax.plot([s for s, _ in eval_points], [v for _, v in eval_points], marker="o", label="evaluation")
        ax.legend()
    ax.set(xlabel="optimizer step", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
