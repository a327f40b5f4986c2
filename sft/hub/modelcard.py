"""The model card (README.md at the repo's root), made with huggingface_hub's ModelCard and ModelCardData from the
run's summary: the base model and datasets in its metadata (so the Hub links them), how to load the model, the
results (training and eval loss, speed), the stage and decisions, the probe's figures, the loss plot, the
settings and the framework versions."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from ..settings import is_hub_name
from ..settings.entries import looks_local

FRAMEWORKS = ("torch", "deepspeed", "transformers", "trl", "accelerate", "datasets", "huggingface_hub")


def hub_name(value: Any) -> str | None:
    """`value` if it names a Hub repo (the card's metadata may only link those), else None."""
    ok = isinstance(value, str) and "/" in value and not looks_local(value) and is_hub_name(value)
    return value if ok else None


def versions() -> dict[str, str]:
    found = {}
    for name in FRAMEWORKS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def last_eval(summary: dict[str, Any]) -> dict[str, float]:
    """The last evaluation's metrics in the Trainer's log (empty when the run evaluated nothing)."""
    history = (summary.get("train") or {}).get("log_history") or []
    evals = [e for e in history if "eval_loss" in e]
    return {k: v for k, v in evals[-1].items() if isinstance(v, (int, float))} if evals else {}


def _rows(pairs: list[tuple[str, Any]]) -> str:
    return "\n".join(f"| {k} | {v} |" for k, v in pairs if v is not None)


def _load(repo_id: str, revision: str | None) -> str:
    rev = f', revision="{revision}"' if revision else ""
    return f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{repo_id}"{rev})
tokenizer = AutoTokenizer.from_pretrained("{repo_id}"{rev})
```

or `hf download {repo_id}{f' --revision {revision}' if revision else ''} --local-dir model`"""


def _results(summary: dict[str, Any]) -> str:
    train, probe = summary.get("train") or {}, summary.get("probe") or {}
    evals = last_eval(summary)
    loss = summary.get("final_loss", train.get("train_loss"))
    rows = [("status", summary.get("status")), ("final training loss", loss),
            ("eval loss", evals.get("eval_loss")), ("optimizer steps", train.get("global_step")),
            ("tokens per second (steady state)", train.get("steady_tokens_per_second")),
            ("training runtime (s)", train.get("train_runtime")),
            ("peak memory reserved per rank (GiB)", ", ".join(map(str, train.get("peak_reserved_gib") or [])) or None),
            ("probe: tokens per second", probe.get("tokens_per_second")),
            ("probe: seconds per step", probe.get("seconds_per_step")),
            ("probe: projected hours", probe.get("projected_hours"))]
    return "| figure | value |\n|---|---|\n" + _rows(rows)


def _data_lines(summary: dict[str, Any]) -> str:
    """The data, the tokens learned and the evaluation, as the summary recorded them (commits included)."""
    data, ev = summary.get("data") or {}, summary.get("eval") or {}
    lines = []
    if (summary.get("settings") or {}).get("trust_remote_code"):  # consent given on purpose: said where users read
        why = (summary.get("decisions") or {}).get("remote_code", "SFT_TRUST_REMOTE_CODE=true")
        lines.append(f"- remote code: {why}; loading this model needs `trust_remote_code=True` as well")
    if summary.get("model_revision"):
        lines.append(f"- base model commit: `{summary['model_revision']}`")
    if data:
        sources = "; ".join(f"`{x['path']}`" + (f" at commit `{x['revision']}`" if x.get("revision") else "")
                            for x in data.get("train", []))
        lines.append(f"- data: {data.get('shape')}, {data.get('train_rows')} rows from {sources}; loss on: "
                     f"{data.get('loss_on')} tokens")
    if ev:
        accuracy = ev.get("mean_token_accuracy")
        lines.append(f"- evaluation ({data.get('eval_rows', '?')} rows) at step {ev.get('step')}: loss "
                     f"{ev['loss']:.4f}" + (f", token accuracy {accuracy:.4f}" if accuracy is not None else ""))
    return "\n".join(lines) + ("\n" if lines else "")


def _stage(summary: dict[str, Any]) -> str:
    """The option as the card's first line says it: the optimizer too where its state was 8-bit."""
    stage = str(summary.get("stage", "?"))
    if stage.endswith("-8bit"):
        return (f"ZeRO-{stage.removesuffix('-8bit')} with bitsandbytes' 8-bit AdamW (its moments in 8 bits, the master "
                "weights in fp32)")
    return f"ZeRO {stage}"


def model_card(summary: dict[str, Any], repo_id: str, revision: str | None = None, plot: bool = True) -> str:
    """README.md for the repo, from the run's summary (run/summary.json)."""
    from huggingface_hub import ModelCard, ModelCardData

    s = summary.get("settings") or {}
    base, dataset = hub_name(s.get("model")), hub_name(s.get("dataset"))
    data = ModelCardData(library_name="transformers", base_model=base, datasets=[dataset] if dataset else None,
                         pipeline_tag="text-generation", tags=["trl", "sft", "deepspeed", "full-fine-tune"])
    decisions = "\n".join(f"- {k}: {v}" for k, v in (summary.get("decisions") or {}).items())
    settings = "\n".join(f"| `SFT_{k.upper()}` | `{v}` |" for k, v in s.items())
    frameworks = "\n".join(f"- {k} {v}" for k, v in versions().items())
    body = f"""# {repo_id.split('/')[-1]}

Full fine-tune of `{s.get('model', '?')}` on `{s.get('dataset', '?')}` (split `{s.get('dataset_split', 'train')}`)
with TRL's SFTTrainer on DeepSpeed {_stage(summary)}, {summary.get('ranks', '?')} rank(s).

{_data_lines(summary)}
## Use

{_load(repo_id, revision)}

## Results

{_results(summary)}
{chr(10) + '![training loss](run/loss.png)' + chr(10) if plot else ''}
## How it was trained

{decisions or '(no decisions recorded)'}

## In this repo

- the model at the root, with `manifest.json` (every file's size and sha256, committed after them)
- `checkpoints/checkpoint-N/`: the newest DeepSpeed checkpoints, each complete once its `manifest.json` is there
- `run/`: the run's summary, settings, probe, loss plot and event log

## Settings

| variable | value |
|---|---|
{settings}

## Framework versions

{frameworks}
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}"))
