"""TRL's SFTTrainer as the seed's sft_ds.py builds it, from the RunSpec the controller decided.

Also used outside the ranks: `entrypoint.py config` builds the same arguments to show the DeepSpeed
JSON the Trainer fills, and the settings refuse, in SFT_TRAINER_ARGS, every argument in OWNED_ARGS.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from types import SimpleNamespace
from typing import Any

from .. import tracking
from ..handoff import DataPlan, RunSpec

# SFTConfig arguments the job sets itself (job_arguments), and the setting a user changes instead:
# SFT_TRAINER_ARGS may not name them (tests/test_trainer.py keeps this list equal to what is set).
OWNED_ARGS = {
    "output_dir": "SFT_OUTPUT_DIR", "deepspeed": "SFT_DS_CONFIG or SFT_ZERO_STAGE",
    "per_device_train_batch_size": "SFT_MICRO_BATCH", "gradient_accumulation_steps": "SFT_GRAD_ACCUM",
    "max_length": "SFT_MAX_LENGTH", "packing": "SFT_PACKING", "num_train_epochs": "SFT_EPOCHS",
    "max_steps": "SFT_MAX_STEPS", "learning_rate": "SFT_LEARNING_RATE", "bf16": "SFT_PRECISION",
    "fp16": "SFT_PRECISION", "activation_checkpointing": "SFT_GRADIENT_CHECKPOINTING",
    "gradient_checkpointing": "SFT_GRADIENT_CHECKPOINTING", "logging_steps": "SFT_LOGGING_STEPS",
    "activation_offloading": "SFT_GRADIENT_CHECKPOINTING (offload)",
    "logging_first_step": "the job (the probe times every step from the first)",
    "save_strategy": "SFT_SAVE_STEPS", "save_steps": "SFT_SAVE_STEPS", "save_total_limit": "SFT_SAVE_TOTAL_LIMIT",
    "seed": "SFT_SEED", "data_seed": "SFT_SEED", "report_to": "SFT_REPORT_TO", "run_name": "SFT_RUN_NAME",
    "ddp_timeout": "SFT_NODE_TIMEOUT_SECONDS", "use_liger_kernel": "SFT_LIGER_KERNELS",
    "torch_compile": "SFT_COMPILE",
    "dataset_num_proc": "the job (a process per 1,000 rows, at most 16: the packed rows depend on it)",
    "logging_nan_inf_filter": "the job (a loss that is not finite stops the run)",
    "model_init_kwargs": "SFT_PRECISION and SFT_ATTENTION",
    "accelerator_config": "the job (the ranks' process group)",
    # the job uploads, and the token stays out of every file (training_args.bin pickles these arguments)
    "hub_token": "HF_TOKEN in the environment", "push_to_hub": "SFT_HUB_REPO", "hub_model_id": "SFT_HUB_REPO",
    "hub_strategy": "SFT_UPLOAD_MINUTES", "hub_private_repo": "SFT_HUB_REPO (always private)",
    # a resume needs the whole DeepSpeed state, and the job decides where it resumes from
    "save_only_model": "the job (a resume needs the optimizer state)",
    "resume_from_checkpoint": "the job (it resumes by itself)",
    # the data: which tokens are learned, the chat template, the evaluation
    "assistant_only_loss": "SFT_LOSS_ON", "completion_only_loss": "SFT_LOSS_ON",
    "chat_template_path": "SFT_CHAT_TEMPLATE", "eval_strategy": "SFT_EVAL_STEPS", "eval_steps": "SFT_EVAL_STEPS",
    "per_device_eval_batch_size": "the job (evaluation batches are as large as training's micro-batches)",
    "dataset_text_field": "the job (it trains on a 'text' column: rename yours)",
    # a row split over GPUs: Accelerate's sequence parallelism, and rows padded to split evenly
    "parallelism_config": "SFT_SEQUENCE_PARALLEL", "pad_to_multiple_of": "SFT_SEQUENCE_PARALLEL",
}
HF_TOKEN_TEXT = re.compile(r"hf_[A-Za-z0-9]{6,}")  # how Hugging Face tokens look


def job_arguments(spec: RunSpec, on_gpu: bool, in_rank: bool = True) -> dict[str, Any]:
    """The SFTConfig arguments the job decides, as the seed sets them."""
    import torch

    probe = spec.mode == "probe"
    data = spec.data or DataPlan(train=[])
    return dict(
        output_dir=spec.output_dir,
        deepspeed=spec.ds_config,  # set before the model loads, so ZeRO-3 shards it while loading
        per_device_train_batch_size=spec.micro_batch,
        gradient_accumulation_steps=spec.grad_accum,
        max_length=spec.max_length,
        packing=spec.packing,  # best-fit decreasing, padding-free: position_ids restart per conversation
        num_train_epochs=spec.epochs,
        max_steps=spec.max_steps,
        learning_rate=spec.learning_rate,
        bf16=spec.bf16,
        # transformers 5's name; TRL's config still defaults the deprecated alias gradient_checkpointing to True,
        # which transformers then overwrites with this value (and warns about when this one is unset)
        activation_checkpointing=spec.gradient_checkpointing,
        activation_offloading=spec.offload_activations,
        logging_steps=1 if probe else spec.logging_steps,
        logging_first_step=True,
        # The Trainer's default logs a NaN step as the mean of the others (0.0 when it logs every step), which
        # hid a diverged run behind plausible numbers: the ranks stop at the first loss that is not finite.
        logging_nan_inf_filter=False,
        save_strategy="no" if probe else "steps",  # a timing run writes no checkpoint
        save_steps=spec.save_steps,
        save_total_limit=spec.save_total_limit,
        seed=spec.seed,
        data_seed=spec.seed,
        report_to="none" if probe else tracking.names(spec.report_to) or "none",  # a probe's steps are no run
        run_name=spec.run_name,
        # A collective waits this long for a lost node's ranks, then fails the job instead of hanging it.
        ddp_timeout=spec.node_timeout_seconds,
        use_liger_kernel=spec.liger_kernels,  # TRL applies the layer kernels only (its fused LM head stays)
        torch_compile=spec.compile,  # each decoder layer, once DeepSpeed has wrapped the model (train.py)
        model_init_kwargs={"dtype": torch.bfloat16 if spec.bf16 else torch.float32,
                           "attn_implementation": spec.attention, "revision": spec.model_revision},
        assistant_only_loss=data.loss_on == "assistant",  # TRL masks all but the assistant's turns
        completion_only_loss=data.loss_on == "completion",  # TRL masks the prompt
        chat_template_path=spec.chat_template,
        dataset_num_proc=data.processes if data.processes > 1 else None,  # TRL's default: one process
        # the probe times evaluation on a few batches itself (ranks/evaluation.py), apart from its steps
        eval_strategy="steps" if data.evaluates and not probe else "no",
        eval_steps=data.eval_steps,
        per_device_eval_batch_size=spec.micro_batch,
        # On CPU ranks the Trainer must use the gloo state train.py made (docs/facts.md). On GPUs each batch is
        # copied from pinned memory without the host waiting for the GPU's queue (reads.py says why)
        accelerator_config={"use_configured_state": in_rank and not on_gpu, "non_blocking": on_gpu},
        parallelism_config=sequence_parallelism(spec),
        pad_to_multiple_of=row_padding(spec, on_gpu),
    )


def sequence_parallelism(spec: RunSpec):
    """Accelerate's ParallelismConfig for DeepSpeed's Ulysses over spec.sequence_parallel GPUs (None: off).
    Data parallelism is what is left: world / N groups, each reading its own rows (the Transformers guide's
    dp_replicate_size); Accelerate sizes DeepSpeed's train_batch_size from it."""
    n = spec.sequence_parallel
    if n == 1:
        return None
    from accelerate.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig

    return ParallelismConfig(sp_backend="deepspeed", sp_size=n, dp_replicate_size=spec.record.world_size // n,
                             sp_handler=DeepSpeedSequenceParallelConfig(sp_attn_implementation=spec.attention))


def row_padding(spec: RunSpec, on_gpu: bool) -> int | str:
    """pad_to_multiple_of: a row split over N GPUs must split evenly, so it is padded to a multiple of N. On
    CPU ranks to the whole SFT_MAX_LENGTH: DeepSpeed's batch adapter all-gathers each rank's batch at its own
    length, which NCCL allows and gloo refuses ("ProcessGroupGloo::allgather: invalid tensor size").
    "auto": TRL's default, no padding off Neuron."""
    if spec.sequence_parallel == 1:
        return "auto"
    return spec.sequence_parallel if on_gpu else spec.max_length


def regional_compilation() -> None:
    """Compile each decoder layer, not the whole model: accelerate's regional compilation (its
    compile_regions_deepspeed, which compiles the DeepSpeed engine's module in place). One layer's graph
    serves all of them, the model's forward (its mask, TRL's fused LM head) stays eager, and on an H200 it
    ran the defaults 18% faster than uncompiled with Liger's kernels, where the whole model compiled through
    DeepSpeed's engine.compile had not finished warming up in 270 s (docs/speed.md, 2026-12-02). Accelerate
    reads it from the environment only, when the Trainer makes its Accelerator: call it in the rank, before."""
    os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "1"


def trainer_arguments(spec: RunSpec, on_gpu: bool, in_rank: bool = True):
    """SFTConfig: the job's arguments and the user's SFT_TRAINER_ARGS (checked in settings: none of the job's)."""
    from trl import SFTConfig

    return SFTConfig(**job_arguments(spec, on_gpu, in_rank), **spec.trainer_args)


def filled_ds_config(config: dict[str, Any], args: Any, world_size: int, model_config: Any,
                     total_steps: int) -> dict[str, Any]:
    """The config with every "auto" filled as the Trainer fills it, by transformers' own code.

    `args` is the run's SFTConfig made without a DeepSpeed config (so no process group starts here);
    its world size is this process's, so the run's is given.
    """
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class _RunArgs:
        def __init__(self):
            self.world_size = world_size

        def __getattr__(self, name):
            return getattr(args, name)

    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    hf.trainer_config_process(_RunArgs())
    hf.trainer_config_finalize(_RunArgs(), SimpleNamespace(config=model_config), total_steps)
    return hf.config


def trainer_args_problems(value: str) -> list[str]:
    """SFT_TRAINER_ARGS: a JSON object of SFTConfig arguments, none of OWNED_ARGS, one line per problem; a token
    typed in it never shown."""
    from trl import SFTConfig

    shown = HF_TOKEN_TEXT.sub("hf_***", value)  # a token typed in here must not reach the log either
    try:
        args = json.loads(value)
    except json.JSONDecodeError as e:
        return [f"SFT_TRAINER_ARGS={shown!r}: not JSON ({e})"]
    if not isinstance(args, dict):
        return [f"SFT_TRAINER_ARGS={shown!r}: " + 'expected a JSON object such as {"dataloader_num_workers": 2}']
    if "hub_token" in args:
        shown = json.dumps({**args, "hub_token": "***"})
    known = {f.name for f in dataclasses.fields(SFTConfig)}
    problems = []
    for name in args:
        if name in OWNED_ARGS:
            problems.append(f"SFT_TRAINER_ARGS={shown!r}: {name} is set by the job: use {OWNED_ARGS[name]}")
        elif name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "not an SFTConfig argument"
            problems.append(f"SFT_TRAINER_ARGS={shown!r}: {name}: unknown argument ({hint})")
    return problems
