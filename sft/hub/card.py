"""What goes up at the end besides final/: the run's reports under run/, and README.md, the model card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data import looks_local
from ..handoff import read_json
from ..settings import REPO_ID
from .errors import TokenFound
from .manifest import FINAL, MANIFEST, hash_file

# The run's reports that go up at the end, from OUTPUT/run/ to run/ in the repo (those that exist).
RUN_FILES = ("summary.json", "loss.png", "settings.json", "ds_config.json", "probe.json")


def upload_reports(api, repo_id: str, run_dir: Path, summary: dict[str, Any] | None) -> None:
    """The run's reports and the model card in one commit; raises TokenFound if one holds the token."""
    from huggingface_hub import CommitOperationAdd

    summary = summary if summary is not None else read_json(run_dir / "summary.json") or {}
    ops = []
    for name in RUN_FILES:
        if (run_dir / name).is_file():
            hash_file(run_dir / name, api.token)  # raises TokenFound: such a file never goes up
            ops.append(CommitOperationAdd(f"run/{name}", str(run_dir / name)))
    card = model_card(summary, repo_id)
    if api.token and api.token in card:
        raise TokenFound("the model card would contain the Hub token")
    ops.append(CommitOperationAdd("README.md", card.encode()))
    api.create_commit(repo_id, ops, commit_message="run reports and model card")


def _hub_name(value: Any) -> str | None:
    """`value` if it names a Hub repo (the card's metadata may only link those), else None."""
    ok = isinstance(value, str) and "/" in value and not looks_local(value) and REPO_ID.match(value)
    return value if ok else None


def _data_lines(summary: dict[str, Any]) -> str:
    """The data, the tokens learned and the evaluation, as the summary recorded them (commits included)."""
    data, ev = summary.get("data") or {}, summary.get("eval") or {}
    lines = []
    if data:
        sources = "; ".join(f"`{x['path']}`" + (f" at commit `{x['revision']}`" if x.get("revision") else "")
                            for x in data.get("train", []))
        lines.append(f"- data: {data.get('shape')}, {data.get('train_rows')} rows from {sources}; loss on: "
                     f"{data.get('loss_on')} tokens")
    if ev:
        accuracy = ev.get("mean_token_accuracy")
        lines.append(f"- evaluation ({data.get('eval_rows', '?')} rows) at step {ev.get('step')}: loss {ev['loss']:.4f}"
                     + (f", token accuracy {accuracy:.4f}" if accuracy is not None else ""))
    return "\n".join(lines) + ("\n" if lines else "")


def model_card(summary: dict[str, Any], repo_id: str) -> str:
    """README.md: base model, dataset, settings, final loss, and how to load the model."""
    from huggingface_hub import ModelCard, ModelCardData

    s = summary.get("settings") or {}
    train = summary.get("train") or {}
    base, dataset = _hub_name(s.get("model")), _hub_name(s.get("dataset"))
    data = ModelCardData(library_name="transformers", base_model=base, datasets=[dataset] if dataset else None,
                         tags=["trl", "sft", "deepspeed", "full-fine-tune"])
    loss = summary.get("final_loss", train.get("train_loss"))
    settings_rows = "\n".join(f"| `SFT_{k.upper()}` | `{v}` |" for k, v in s.items())
    revision = f" (commit `{summary['model_revision']}`)" if summary.get("model_revision") else ""
    body = f"""# {repo_id.split('/')[-1]}

Full fine-tune of `{s.get('model', '?')}`{revision} on `{s.get('dataset', '?')}`
(split `{s.get('dataset_split', 'train')}`)
with TRL's SFTTrainer on DeepSpeed ZeRO {summary.get('stage', '?')}, {summary.get('ranks', '?')} rank(s).

- status: {summary.get('status', '?')}
- final training loss: {loss if loss is not None else 'n/a'}
- optimizer steps: {train.get('global_step', 'n/a')}; tokens per second: {train.get('tokens_per_second', 'n/a')}
{_data_lines(summary)}
## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{repo_id}", subfolder="{FINAL}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}", subfolder="{FINAL}")
```

## In this repo

- `{FINAL}/`: the 16-bit model; `{FINAL}/{MANIFEST}` lists every file with its size and sha256
- `checkpoint-N/`: the newest DeepSpeed checkpoints; one is complete only with its `{MANIFEST}`
- `run/summary.json`, `run/loss.png`: the run's figures and loss curve

## Settings

| variable | value |
|---|---|
{settings_rows}
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))
