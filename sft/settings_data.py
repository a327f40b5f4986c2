"""The settings that say what is trained on: the model, its data, the tokens learned, the evaluation. The
first fields of Settings (sft/settings.py), kept here so that file stays readable; `setting` declares a field
of either with its help text, which `entrypoint.py --help` and the README's table show."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LOSS_ON = ("auto", "all", "assistant", "completion")


def setting(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})



@dataclass(frozen=True, kw_only=True)
class TrainedOn:
    """The model and the data, as SFT_* variables give them."""

    model: str = setting("Qwen/Qwen3-8B", "Model: a Hub name or a local folder.")
    model_revision: str | None = setting(None, "The Hub model's branch, tag or commit; resolved to a commit at start "
                                         "and recorded in the summary and the model card.")
    dataset: str = setting("trl-lib/Capybara", "Training data: a Hub name, a local .jsonl/.json/.parquet/.csv "
                           "file or a folder of them, or a save_to_disk folder; several, comma-separated, make a "
                           "mixture, each optionally ending in :ROWS (rows drawn from it) or :WEIGHT (with a decimal "
                           "point: 0.5 takes half its rows). Shapes: see Bring your data.")
    dataset_split: str = setting("train", "Split to train on, local data too (a file is the split train; a folder's "
                                 "files named for splits are its splits); slices such as train[:1000] work.")
    dataset_config: str | None = setting(None, "The Hub dataset's configuration (subset) name.")
    dataset_revision: str | None = setting(None, "The Hub dataset's branch, tag or commit; resolved to a commit at "
                                           "start and recorded in the summary and the model card.")
    chat_template: str | None = setting(None, "A chat template to train with instead of the model's: a .jinja file, "
                                        "or a model (Hub name or folder) to take it and its special tokens from "
                                        "(TRL's chat_template_path). final/ is saved with it.")
    loss_on: str = setting("auto", "Tokens that carry the loss: all; assistant (the assistant turns of "
                           "conversations; the chat template must mark them, see SFT_CHAT_TEMPLATE); completion "
                           "(prompt/completion data). auto: completion for prompt/completion data, all otherwise "
                           "(TRL's defaults).", choices=LOSS_ON)
    eval_dataset: str | None = setting(None, "Evaluation data, as SFT_DATASET (split SFT_EVAL_SPLIT, default train).")
    eval_split: str | None = setting(None, "Evaluate on this split: of SFT_EVAL_DATASET, or else of SFT_DATASET.")
    eval_fraction: float = setting(0.0, "Or hold out this fraction of the training rows for evaluation (seeded by "
                                   "SFT_SEED: the same rows on every start); 0: none.", min=0, lt=1)
    eval_steps: int | None = setting(None, "Evaluate every this many optimizer steps, and at the end; unset: with "
                                     "each checkpoint (SFT_SAVE_STEPS).", min=1)
