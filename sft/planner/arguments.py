"""The Trainer's arguments: SFTConfig's keyword arguments for one launch of the ranks, from the settings and the
decision, as the seed's sft_ds.py sets them. Pure.

Each argument the job sets is one line of ARGUMENTS: its name, the setting a user changes instead (SFT_TRAINER_ARGS
may not name it: OWNED is derived from the same lines), and its value. The ranks pass them to SFTConfig as they
are (RunSpec.sft_config), after SFT_TRAINER_ARGS's own; `entrypoint.py config` shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import tracking
from ..handoff import DataPlan
from ..settings import Settings
from .decision import Decision


@dataclass(frozen=True)
class Run:
    """One launch of the ranks: the settings, the decision, and what differs between its launches (a probe's or the
    training's steps, and where they go)."""

    settings: Settings
    decision: Decision
    mode: str  # "probe" (times steps, saves nothing) or "train"
    output_dir: str  # the Trainer's: checkpoints go here
    max_steps: int
    ds_config: str = ""  # the DeepSpeed JSON's path

    @property
    def probe(self) -> bool:
        return self.mode == "probe"

    @property
    def data(self) -> DataPlan:
        return self.decision.data or DataPlan(train=[])


@dataclass(frozen=True)
class Argument:
    name: str  # SFTConfig's
    owner: str  # what a user sets instead
    value: Callable[[Run], Any]


def _report_to(r: Run) -> str | list[str]:
    return "none" if r.probe else tracking.names(r.settings.report_to) or "none"  # a probe's steps are no run


def _sequence_parallelism(r: Run) -> dict[str, Any] | None:
    """DeepSpeed's Ulysses over N GPUs as Accelerate's ParallelismConfig takes it (the ranks make the object): data
    parallelism is what is left, world / N groups each reading its own rows (the Transformers guide's
    dp_replicate_size); Accelerate sizes DeepSpeed's train_batch_size from it. None: off."""
    n = r.decision.sequence_parallel
    if n == 1:
        return None
    return {"sp_backend": "deepspeed", "sp_size": n, "dp_replicate_size": r.decision.ranks.world // n,
            "sp_attn_implementation": r.decision.attention}


def _row_padding(r: Run) -> int | str:
    """A row split over N GPUs must split evenly, so it is padded to a multiple of N. On CPU ranks to the whole
    SFT_MAX_LENGTH: DeepSpeed's batch adapter all-gathers each rank's batch at its own length, which NCCL allows and
    gloo refuses ("ProcessGroupGloo::allgather: invalid tensor size"). "auto": TRL's default, no padding off Neuron."""
    n = r.decision.sequence_parallel
    return "auto" if n == 1 else n if r.decision.ranks.on_gpu else r.settings.max_length


ARGUMENTS: tuple[Argument, ...] = (
    Argument("output_dir", "SFT_OUTPUT_DIR", lambda r: r.output_dir),
    # set before the model loads, so ZeRO-3 shards it while loading
    Argument("deepspeed", "SFT_DS_CONFIG or SFT_ZERO_STAGE", lambda r: r.ds_config),
    Argument("per_device_train_batch_size", "SFT_MICRO_BATCH", lambda r: r.decision.split.micro_batch),
    Argument("gradient_accumulation_steps", "SFT_GRAD_ACCUM", lambda r: r.decision.split.grad_accum),
    Argument("max_length", "SFT_MAX_LENGTH", lambda r: r.settings.max_length),
    # best-fit decreasing, padding-free: position_ids restart per conversation
    Argument("packing", "SFT_PACKING", lambda r: r.settings.packing),
    Argument("num_train_epochs", "SFT_EPOCHS", lambda r: r.settings.epochs),
    Argument("max_steps", "SFT_MAX_STEPS", lambda r: r.max_steps),
    Argument("learning_rate", "SFT_LEARNING_RATE", lambda r: r.settings.learning_rate),
    Argument("bf16", "SFT_PRECISION", lambda r: r.decision.bf16),
    Argument("fp16", "SFT_PRECISION", lambda r: False),
    # transformers 5's name; gradient_checkpointing is its deprecated alias (TRL's config defaults it to True), made
    # the same here, as transformers itself makes it once this one is set
    Argument("activation_checkpointing", "SFT_GRADIENT_CHECKPOINTING",
             lambda r: r.decision.split.gradient_checkpointing),
    Argument("gradient_checkpointing", "SFT_GRADIENT_CHECKPOINTING", lambda r: r.decision.split.gradient_checkpointing),
    Argument("activation_offloading", "SFT_GRADIENT_CHECKPOINTING (offload)",
             lambda r: r.decision.split.offload_activations),
    Argument("logging_steps", "SFT_LOGGING_STEPS", lambda r: 1 if r.probe else r.settings.logging_steps),
    Argument("logging_first_step", "the job (the probe times every step from the first)", lambda r: True),
    # The Trainer's default logs a NaN step as the mean of the others (0.0 when it logs every step), which hid a
    # diverged run behind plausible numbers: the ranks stop at the first loss that is not finite.
    Argument("logging_nan_inf_filter", "the job (a loss that is not finite stops the run)", lambda r: False),
    # A timing run saves none; by time (SFT_SAVE_MINUTES) the ranks' clock decides every save (sft/ranks/cadence.py)
    Argument("save_strategy", "SFT_SAVE_STEPS or SFT_SAVE_MINUTES",
             lambda r: "steps" if not r.probe and r.settings.save_steps is not None else "no"),
    Argument("save_steps", "SFT_SAVE_STEPS", lambda r: r.settings.save_steps or 500),  # 500: the Trainer's own, unused
    Argument("save_total_limit", "SFT_SAVE_TOTAL_LIMIT", lambda r: r.settings.save_total_limit),
    Argument("seed", "SFT_SEED", lambda r: r.settings.seed),
    Argument("data_seed", "SFT_SEED", lambda r: r.settings.seed),
    Argument("report_to", "SFT_REPORT_TO", _report_to),
    Argument("run_name", "SFT_RUN_NAME", lambda r: r.settings.run_name),
    # A collective waits this long for a lost node's ranks, then fails the job instead of hanging it.
    Argument("ddp_timeout", "SFT_NODE_TIMEOUT_SECONDS", lambda r: r.settings.node_timeout_seconds),
    # TRL applies the layer kernels only (its fused LM head stays)
    Argument("use_liger_kernel", "SFT_LIGER_KERNELS", lambda r: r.decision.liger),
    # each decoder layer, once DeepSpeed has wrapped the model (sft/ranks/train.py)
    Argument("torch_compile", "SFT_COMPILE", lambda r: r.decision.compile),
    Argument("model_init_kwargs", "SFT_PRECISION and SFT_ATTENTION",
             lambda r: {"dtype": "bfloat16" if r.decision.bf16 else "float32",
                        "attn_implementation": r.decision.attention, "revision": r.decision.model_revision}),
    # the model's own code (its auto_map): TRL passes it to the model's and the tokenizer's loading; False makes
    # transformers refuse such a model instead of asking on stdin
    Argument("trust_remote_code", "SFT_TRUST_REMOTE_CODE", lambda r: r.settings.trust_remote_code),
    Argument("assistant_only_loss", "SFT_LOSS_ON", lambda r: r.data.loss_on == "assistant"),  # TRL masks the rest
    Argument("completion_only_loss", "SFT_LOSS_ON", lambda r: r.data.loss_on == "completion"),  # TRL masks prompts
    Argument("chat_template_path", "SFT_CHAT_TEMPLATE", lambda r: r.settings.chat_template),
    # TRL's default is one process; the packed rows depend on the count (sft/data/tokens.py)
    Argument("dataset_num_proc", "the job (a process per 1,000 rows, at most 16: the packed rows depend on it)",
             lambda r: r.data.processes if r.data.processes > 1 else None),
    # the probe times evaluation on a few batches itself (sft/ranks/evaluation.py), apart from its steps
    # eval_steps None: with each checkpoint saved by time, as the ranks' clock sets it (sft/ranks/cadence.py)
    Argument("eval_strategy", "SFT_EVAL_STEPS",
             lambda r: "steps" if r.data.evaluates and r.data.eval_steps and not r.probe else "no"),
    Argument("eval_steps", "SFT_EVAL_STEPS", lambda r: r.data.eval_steps),
    Argument("per_device_eval_batch_size", "the job (evaluation batches are as large as training's micro-batches)",
             lambda r: r.decision.split.micro_batch),
    Argument("dataset_text_field", "the job (it trains on a 'text' column: rename yours)", lambda r: "text"),
    # On CPU ranks the Trainer must use the gloo state the rank made (docs/facts.md). On GPUs each batch is copied
    # from pinned memory without the host waiting for the GPU's queue (sft/ranks/patches/reads.py says why)
    Argument("accelerator_config", "the job (the ranks' process group)",
             lambda r: {"use_configured_state": not r.decision.ranks.on_gpu, "non_blocking": r.decision.ranks.on_gpu}),
    Argument("parallelism_config", "SFT_SEQUENCE_PARALLEL", _sequence_parallelism),
    Argument("pad_to_multiple_of", "SFT_SEQUENCE_PARALLEL", _row_padding),
    # the job uploads, and the token stays out of every file (training_args.bin pickles these arguments): each is
    # the Trainer's own default, written here so SFT_TRAINER_ARGS cannot change it
    Argument("hub_token", "HF_TOKEN in the environment", lambda r: None),
    Argument("push_to_hub", "SFT_HUB_REPO", lambda r: False),
    Argument("hub_model_id", "SFT_HUB_REPO", lambda r: None),
    Argument("hub_strategy", "SFT_UPLOAD_MINUTES", lambda r: "every_save"),
    Argument("hub_private_repo", "SFT_HUB_REPO (always private)", lambda r: None),
    # a resume needs the whole DeepSpeed state, and the job decides where it resumes from
    Argument("save_only_model", "the job (a resume needs the optimizer state)", lambda r: False),
    Argument("resume_from_checkpoint", "the job (it resumes by itself)", lambda r: None),
)
OWNED: dict[str, str] = {a.name: a.owner for a in ARGUMENTS}  # SFT_TRAINER_ARGS may name none of these


def arguments(run: Run) -> dict[str, Any]:
    """SFTConfig's keyword arguments: the job's and SFT_TRAINER_ARGS's (which may name none of the job's); and the
    optimizer of an option with 8-bit state (stages.py). `optim` is no line of ARGUMENTS: SFT_TRAINER_ARGS may name
    an optimizer of its own, and then no option with 8-bit state is chosen (settings/checks.py, planner/optimizer.py)."""
    job = {a.name: a.value(run) for a in ARGUMENTS}
    if run.decision.stage.optimizer:
        job["optim"] = run.decision.stage.optimizer
    return {**job, **run.settings.extra_trainer_args}
