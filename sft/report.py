"""The run's reports in the output folder: settings as resolved, the summary and the loss plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write atomically (a reader, or a VM that dies mid-write, never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):  # missing, unreadable or half-written: no report
        return None


def losses(log_history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, loss) pairs from the Trainer's log history."""
    return [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]


def plot_loss(points: list[tuple[int, float]], path: Path, title: str) -> Path | None:
    """The loss curve as a PNG (matplotlib's Agg backend: no display needed)."""
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in points], [v for _, v in points], marker="." if len(points) < 50 else None)
    ax.set(xlabel="optimizer step", ylabel="training loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
