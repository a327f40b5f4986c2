"""What goes up at the end besides the final model: the run's reports under run/, and README.md, the model card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..handoff import read_json
from .errors import TokenFound
from .manifest import hash_file

# The run's reports that go up at the end, from OUTPUT/run/ to run/ in the repo (those that exist).
RUN_FILES = ("summary.json", "loss.png", "settings.json", "ds_config.json", "probe.json", "events.jsonl")


def upload_reports(api, repo_id: str, run_dir: Path, summary: dict[str, Any] | None,
                   revision: str | None = None) -> None:
    """The run's reports and the model card in one commit; raises TokenFound if one holds the token."""
    from huggingface_hub import CommitOperationAdd

    summary = summary if summary is not None else read_json(run_dir / "summary.json") or {}
    ops = []
    for name in RUN_FILES:
        if (run_dir / name).is_file():
            hash_file(run_dir / name, api.token)  # raises TokenFound: such a file never goes up
            ops.append(CommitOperationAdd(f"run/{name}", str(run_dir / name)))
    card = model_card(summary, repo_id, revision, plot=(run_dir / "loss.png").is_file())
    if api.token and api.token in card:
        raise TokenFound("the model card would contain the Hub token")
    ops.append(CommitOperationAdd("README.md", card.encode()))
    api.create_commit(repo_id, ops, commit_message="run reports and model card", revision=revision)


def model_card(summary: dict[str, Any], repo_id: str, revision: str | None = None, plot: bool = True) -> str:
    """README.md: the model card (modelcard.py)."""
    from .modelcard import model_card as card

    return card(summary, repo_id, revision, plot)
