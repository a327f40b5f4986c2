"""The settings' fields: one frozen dataclass, a field per SFT_* variable, each with the help text that
`entrypoint.py --help` and docs/settings.md show (parse.py reads them from the environment)."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import nodes, stages, tracking

PREFIX = "SFT_"
STAGES = ("auto", *stages.NAMES)
LAUNCHERS = ("torchrun", "deepspeed")
ATTENTIONS = ("auto", "flex_attention", "sdpa", "eager", "flash_attention_4")
SWITCH = ("auto", "true", "false")
CHECKPOINTING = (*SWITCH, "offload")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
PRECISIONS = ("auto", "bf16", "fp32")
BUDGET_ACTIONS = ("refuse", "truncate")
LONG_ROWS = ("truncate", "drop", "error")
LOSS_ON = ("auto", "all", "assistant", "completion")
EMPTY_ROWS = ("error", "drop")
# The most a number may be, unless its field says (max=): past these the libraries overflow (int32 sizes, float())
INT_MAX, FLOAT_MAX = 2**31 - 1, 1e9
# The variables of the ecosystem the job reads under their own names (documented, never SFT_).
ECOSYSTEM_VARS = {
    "HF_TOKEN": "Hugging Face token (write access) for SFT_HUB_REPO, found as huggingface_hub finds it: HF_TOKEN, "
                "else the file HF_TOKEN_PATH names, else a login saved by `hf auth login`; read at run time, never "
                "stored.",
    "SLURM_JOB_END_TIME": "Under SLURM, the job's end time: the job stops in time for it as for SFT_TIME_LIMIT "
                          "(when unset, squeue is asked).",
    "HF_HOME": "Hugging Face cache (models, datasets); in the image, under the mounted /data.",
    "HF_HUB_OFFLINE": "1: never contact the Hub (models and data must be local or cached).",
    "HF_HUB_DISABLE_XET": "Unset: downloads take Xet, the job's uploads Git LFS (the path its tests run); "
                          "1: Git LFS for both; 0: Xet for both.",
    "CUDA_VISIBLE_DEVICES": "The GPUs the container sees; SFT_GPUS picks among them.",
    **nodes.VARIABLES,
}


def _setting(default: Any, help: str, **meta: Any) -> Any:
    """A field and its help; meta: choices, min, gt, lt, max (bounds parse.py checks; max defaults to INT_MAX or
    FLOAT_MAX), auto (an int field takes "auto")."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a run needs, as resolved from the environment. Each field is one variable: field `micro_batch` is
    `SFT_MICRO_BATCH`; its help is what `entrypoint.py --help` and docs/settings.md show."""

    config: str | None = _setting(None, "A YAML job file of settings, for one brought from TRL (`trl sft --config`) "
                                  "or Axolotl: keys are these settings' names (learning_rate, or SFT_LEARNING_RATE) "
                                  "or TRL's for them (model_name_or_path, num_train_epochs, ...: docs/settings.md); "
                                  "the environment wins over it. Also `entrypoint.py --config FILE`.")
    # what is trained on: the model, its data, the tokens learned, the evaluation
    model: str = _setting("Qwen/Qwen3-8B", "Model: a Hub name or a local folder.")
    model_revision: str | None = _setting(None, "The Hub model's branch, tag or commit; resolved to a commit at start "
                                          "and recorded in the summary and the model card.")
    trust_remote_code: bool = _setting(False, "Run the model's own code: a model whose config.json maps its classes "
                                       "to Python files of its repo or folder (auto_map), for an architecture "
                                       "transformers does not have. false: such a model is refused before anything "
                                       "runs; true: its code runs in the controller and every rank, trusted on "
                                       "purpose (said in the decision and the model card).")
    dataset: str = _setting("trl-lib/Capybara", "Training data: a Hub name, a local .jsonl/.json/.parquet/.csv "
                            "file (the text ones also as .gz, .bz2 or .xz) or a folder of them, or a save_to_disk "
                            "folder; several, comma-separated, make a mixture, each optionally ending in :ROWS (rows "
                            "drawn from it) or :WEIGHT (with a decimal point: 0.5 takes half its rows). Shapes: see "
                            "Bring your data.")
    dataset_split: str = _setting("train", "Split to train on, local data too (a file is the split train; a folder's "
                                  "files named for splits are its splits); slices such as train[:1000] work.")
    dataset_config: str | None = _setting(None, "The Hub dataset's configuration (subset) name.")
    dataset_revision: str | None = _setting(None, "The Hub dataset's branch, tag or commit; resolved to a commit at "
                                            "start and recorded in the summary and the model card.")
    chat_template: str | None = _setting(None, "A chat template to train with instead of the model's: a .jinja file, "
                                         "or a model (Hub name or folder) to take it and its special tokens from "
                                         "(TRL's chat_template_path). final/ is saved with it.")
    loss_on: str = _setting("auto", "Tokens that carry the loss: all; assistant (the assistant turns of "
                            "conversations; the chat template must mark them, see SFT_CHAT_TEMPLATE); completion "
                            "(prompt/completion data). auto: completion for prompt/completion data, all otherwise "
                            "(TRL's defaults).", choices=LOSS_ON)
    eval_dataset: str | None = _setting(None, "Evaluation data, as SFT_DATASET (split SFT_EVAL_SPLIT, default train).")
    eval_split: str | None = _setting(None, "Evaluate on this split: of SFT_EVAL_DATASET, or else of SFT_DATASET.")
    eval_fraction: float = _setting(0.0, "Or hold out this fraction of the training rows for evaluation (seeded by "
                                    "SFT_SEED: the same rows on every start); 0: none.", min=0, lt=1)
    eval_steps: int | None = _setting(None, "Evaluate every this many optimizer steps, and at the end; unset: with "
                                      "each checkpoint (SFT_SAVE_MINUTES or SFT_SAVE_STEPS).", min=1)
    # how it is trained and run
    zero_stage: str = _setting("auto", "ZeRO stage: " + ", ".join(STAGES) + "; auto: the lowest that the planner "
                               "predicts to fit, confirmed by the probe. Ignored when SFT_DS_CONFIG is set.",
                               choices=STAGES)
    optimizer: str = _setting("auto", "The optimizer's state: adamw (AdamW, two fp32 moments: 8 bytes a parameter), "
                              "adamw-8bit (bitsandbytes' 8-bit AdamW: about 2 bytes a parameter; DeepSpeed keeps the "
                              "fp32 master weights), or auto: full precision wherever an option fits on the GPUs (on "
                              "one GPU, ZeRO-1 or 2: ZeRO-3 shards nothing there), 8-bit where none does, before "
                              "offloading the optimizer to the CPU (slower); the decision says which. With SFT_ZERO_STAGE=2, adamw-8bit runs option 2-8bit.",
                              choices=stages.OPTIMIZERS)
    ds_config: str | None = _setting(None, "A DeepSpeed JSON of your own; wins over SFT_ZERO_STAGE. At ZeRO-3 it must set "
                                      "stage3_gather_16bit_weights_on_model_save to true (the final model's weights).")
    probe_steps: int = _setting(50, "Optimizer steps of the timing probe before training; 0 skips it. On one node, "
                                "with no checkpoint among them, they are the training's first steps: its launch goes "
                                "on as the training unless their figures change the decision.", min=0)
    max_steps: int = _setting(-1, "Stop after this many optimizer steps; -1 trains SFT_EPOCHS full epochs.", min=-1)
    epochs: float = _setting(1.0, "Epochs to train (fractions allowed).", gt=0)
    tokens_per_step: int = _setting(8192, "Tokens per GPU (per group of SFT_SEQUENCE_PARALLEL GPUs that share "
                                    "each row) per optimizer step, as rows of SFT_MAX_LENGTH tokens (at "
                                    "least one): 8192 is 4 packed rows of 2048, about twice the seed's 4 "
                                    "conversations. A longer SFT_MAX_LENGTH keeps it (fewer, longer rows), so "
                                    "raising the length does not multiply the data per step. Used where "
                                    "SFT_MICRO_BATCH is unset.", min=1)
    micro_batch: int | None = _setting(None, "Rows per GPU per forward pass (packed rows of SFT_MAX_LENGTH tokens, "
                                       "or conversations with SFT_PACKING=false; the seed's recipe: 1); unset: "
                                       "SFT_TOKENS_PER_STEP's rows, split by the batch search.", min=1)
    grad_accum: int | None = _setting(None, "Micro-batches accumulated per optimizer step (the seed's recipe: 4); "
                                      "unset: 1, or the rows of SFT_TOKENS_PER_STEP left by SFT_MICRO_BATCH.",
                                      min=1)
    batch_search: str = _setting("auto", "Before the probe, time in short probes the splits of the rows per step "
                                 "(micro-batch x accumulation) that fit by the planner "
                                 "and can be the fastest (with SFT_GRADIENT_CHECKPOINTING=auto: the largest "
                                 "micro-batch without checkpointing against a larger one with it), and keep the "
                                 "fastest: the same rows per step. auto: on GPUs, unless SFT_MICRO_BATCH or "
                                 "SFT_GRAD_ACCUM is set; true: every split that fits (3 at most), CPU too; false.",
                                 choices=SWITCH)
    max_length: int = _setting(2048, "Tokens per sequence (row); longer rows: SFT_LONG_ROWS.", min=8)
    long_rows: str = _setting("truncate", "Training rows longer than SFT_MAX_LENGTH, every one counted by the data "
                              "step before any rank starts: truncate (TRL cuts each at the length), drop (left "
                              "out), or error (exit 2 before anything is written, naming how many, the first "
                              "and the longest, and an SFT_MAX_LENGTH that fits 99% of the rows or all).",
                              choices=LONG_ROWS)
    empty_rows: str = _setting("error", "Rows that teach nothing: an empty or blank text, an empty completion, an "
                               "assistant turn with no content (and no tool call), which would teach the model to "
                               "answer nothing. error: exit 2 naming their rows; drop: left out of the training and "
                               "evaluation rows, counted in the log and the summary.", choices=EMPTY_ROWS)
    sequence_parallel: int | str = _setting("auto", "GPUs of a node that share each row (DeepSpeed's Ulysses sequence "
                                            "parallelism; each holds 1/N of its tokens), so rows too long for one GPU "
                                            "train. Needs SFT_PACKING=false and sdpa attention. auto: 1, or on "
                                            "several GPUs the fewest that fit a row where one GPU cannot.", min=1,
                                            auto=True)
    packing: bool = _setting(True, "Pack conversations into rows of SFT_MAX_LENGTH tokens, each attending only to "
                             "itself (SFT_MICRO_BATCH then counts rows); false: one padded conversation per row.")
    attention: str = _setting("auto", "Attention kernel: " + ", ".join(ATTENTIONS) + "; auto: flash_attention_4 "
                              "where the layers are compiled, the GPUs are compute capability 9.0+, flash-attn-4 "
                              "imports and rows are up to 8,192 tokens (on an H200 8-10% faster than flex, the "
                              "same loss; 19% slower at 16,384), else flex_attention on GPUs (its block mask skips "
                              "the other sequences of a packed row), sdpa on CPU; where the model's transformers "
                              "class lacks that kernel (Gemma2 has no sdpa, GPT-2 no flex), the next it runs: "
                              "flex_attention, sdpa, eager. The reason is in the decision's log; a kernel set here "
                              "that the class lacks is refused before any rank starts. "
                              "flash_attention_4: FlashAttention-4's kernels (flash-attn-4, in the image), on "
                              "GPUs of compute capability 9.0 or newer (H100, H200, B200), each packed sequence "
                              "attending to itself as with flex.", choices=ATTENTIONS)
    liger_kernels: str = _setting("auto", "Liger's Triton kernels for RMSNorm, SwiGLU and RoPE (TRL's "
                                  "use_liger_kernel): true, false, or auto: on GPUs where liger-kernel is "
                                  "installed (the image has it) and the layers are not compiled (SFT_COMPILE), "
                                  "off on CPU (true with SFT_COMPILE=true is refused: compiled with them, the "
                                  "loss was NaN).", choices=SWITCH)
    learning_rate: float = _setting(1e-5, "Peak learning rate (AdamW).", gt=0)
    save_minutes: float | None = _setting(None, "Minutes of training between checkpoints (and one at a stop; "
                                          "the end writes the model alone, final/); unset: SFT_UPLOAD_MINUTES, so "
                                          "every checkpoint saved is one the uploader sends. Not with SFT_SAVE_STEPS.",
                                          gt=0)
    save_steps: int | None = _setting(None, "Save a checkpoint every this many optimizer steps instead of by time "
                                      "(SFT_SAVE_MINUTES).", min=1)
    save_total_limit: int = _setting(2, "Checkpoints kept (the newest); older ones are deleted.", min=1)
    save_background: str = _setting("auto", "Write each checkpoint while the steps go on: its tensors copied into "
                                     "host memory kept for it (one checkpoint's size per node), its files written "
                                     "from another thread and complete once renamed. true, false, or auto: on where "
                                     "that memory fits in the host's with room to spare, off otherwise (the decision "
                                     "says which).", choices=SWITCH)
    compile: str = _setting("auto", "torch.compile each decoder layer (TRL's torch_compile, accelerate's regional "
                            "compilation): true, false, or auto: on with ZeRO-1 and 2 on GPUs (on H200s the "
                            "defaults trained 12-18% faster so, the same loss and peak memory), off with ZeRO-3, "
                            "rows split over GPUs, SFT_LIGER_KERNELS=true and on CPU. Compiled, Liger's kernels "
                            "are off (with them the loss was NaN). The first steps compile (the probe counts "
                            "them); the compiled kernels are cached under SFT_OUTPUT_DIR/run/compile-cache for a "
                            "resumed job.",
                            choices=SWITCH)
    gradient_checkpointing: str = _setting("auto", "Recompute activations in backward to save memory: true, false, "
                                           "offload (checkpoints kept in host memory: long rows), or auto: off "
                                           "where the planner predicts the stage fits without it, offload where "
                                           "it fits only that way; confirmed by the probe.", choices=CHECKPOINTING)
    trainer_args: str | None = _setting(None, "JSON object of further SFTConfig arguments under TRL's own names, "
                                        "for levers the image has no setting for, e.g. "
                                        "{\"dataloader_num_workers\": 2}. Arguments the job sets itself are refused, "
                                        "naming the SFT_ variable.")
    logging_steps: int = _setting(10, "Log the loss every this many optimizer steps.", min=1)
    report_to: str = _setting("none", "Experiment trackers the Trainer logs to (its report_to), comma-separated: "
                              "none; " + tracking.describe() + ".")
    run_name: str | None = _setting(None, "The run's name in the trackers (the Trainer's run_name); unset: theirs.")
    seed: int = _setting(42, "Random seed (data order, initialisation of new weights).", min=0,
                         max=2**32 - 1)  # numpy's seed
    precision: str = _setting("auto", "bf16 or fp32; auto: bf16 on GPUs, fp32 on CPU.", choices=PRECISIONS)
    output_dir: str = _setting("output", "Where checkpoints, final/ and the run's reports go.")
    gpus: str = _setting("all", "GPUs to use: all, or a list such as 0,1,2,3.")
    cpu_ranks: int = _setting(2, "Ranks to start on a machine with no GPU (CPU, gloo): demos and tests.", min=1,
                              max=256)
    launcher: str = _setting("torchrun", "What starts the ranks: torchrun or deepspeed.", choices=LAUNCHERS)
    price_per_hour: float | None = _setting(None, "Price of the machine per hour, for the probe's cost projection.",
                                            gt=0)
    max_hours: float | None = _setting(None, "Hours the job may take, checked after the probe against its "
                                       "projection (steps, saves, evaluation, the final upload); see "
                                       "SFT_BUDGET_ACTION.", gt=0)
    max_cost: float | None = _setting(None, "Cost the job may reach at SFT_PRICE_PER_HOUR (which it needs), "
                                      "checked as SFT_MAX_HOURS is.", gt=0)
    budget_action: str = _setting("refuse", "Over SFT_MAX_HOURS or SFT_MAX_COST: refuse (exit 12 before training, "
                                  "naming the settings that would fit) or truncate (train the steps that fit, then "
                                  "the final model as usual).", choices=BUDGET_ACTIONS)
    time_limit: str | None = _setting(None, "Stop in time: a duration from the job's start (3h30m, 90m) or an end "
                                      "time (2026-12-01T18:00:00Z). Early enough to save and upload a checkpoint, "
                                      "as long as this run measured those to take; then exit 75 (start again to "
                                      "resume). SLURM's job end time counts too: the earlier wins.")
    hub_repo: str | None = _setting(None, "Private Hugging Face repo (owner/name) for checkpoints; unset: no upload.")
    hub_revision: str | None = _setting(None, "Branch of SFT_HUB_REPO the job uploads to (made from main if "
                                        "missing), so several runs can share a repo; unset: main.")
    upload_minutes: float = _setting(30.0, "Minutes between checkpoint uploads to SFT_HUB_REPO.", gt=0)
    stop_grace_seconds: int = _setting(300, "On SIGTERM, seconds allowed to save a checkpoint and upload it.", min=0)
    node_timeout_seconds: int = _setting(1800, "Seconds a node waits for the others: to join at start, and in every "
                                         "collective (the process-group timeout, the Trainer's own default), so a "
                                         "lost node fails the job on every node instead of hanging it. Keep it above "
                                         "the longest wait at a collective (tokenising the data on rank 0, gathering "
                                         "or writing a checkpoint).", min=1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def save_seconds(self) -> float | None:
        """Seconds of training between checkpoints; None: every SFT_SAVE_STEPS steps instead."""
        if self.save_steps is not None:
            return None
        return (self.upload_minutes if self.save_minutes is None else self.save_minutes) * 60

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir)

    @property
    def extra_trainer_args(self) -> dict[str, Any]:
        """SFT_TRAINER_ARGS as a dict (check() refuses what is not a JSON object)."""
        return json.loads(self.trainer_args or "{}")

    @functools.cached_property
    def user_ds_config(self) -> dict[str, Any] | None:
        """SFT_DS_CONFIG's contents, read once (check() reports a file that cannot be read)."""
        return None if self.ds_config is None else json.loads(Path(self.ds_config).read_text())
