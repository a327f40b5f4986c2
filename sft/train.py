"""What every rank runs: TRL's SFTTrainer on DeepSpeed, as the seed's sft_ds.py does.

Started by the launcher (torchrun or deepspeed), never by hand:
    python -m sft.train RUN_SPEC.json
The controlling process (sft/job.py) writes RUN_SPEC.json; each rank writes a report JSON back.
Exit codes of a rank: 0 done (or stopped on request, said in the report), 42 out of GPU memory.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from .checkpoints import RECORD
from .launch import die_with_parent

RANK_OOM_EXIT = 42


def main(spec_path: str) -> int:
    die_with_parent()  # a rank whose launcher was killed must not train on alone
    spec = json.loads(Path(spec_path).read_text())
    on_gpu = _setup_distributed(spec["settings"]["node_timeout_seconds"])
    stop = StopRequest(Path(spec["stop_file"]))
    signal.signal(signal.SIGTERM, stop.on_signal)
    report: dict[str, Any] = {"mode": spec["mode"], "status": "started"}
    try:
        trainer = build_trainer(spec, on_gpu, stop, report)
        _simulated_oom(spec)
        _reset_peak_memory(on_gpu)
        result = trainer.train(resume_from_checkpoint=spec.get("resume"))
        report.update(_results(trainer, result, stop))
        if spec["mode"] == "train" and not stop.requested:
            trainer.save_model(spec["final_dir"])  # ZeRO-3 gathers the 16-bit weights for this
    except Exception as e:  # every failure is reported to the controller, then re-raised
        report.update(status="oom" if _is_oom(e) else "failed", error=f"{type(e).__name__}: {e}")
        if _is_oom(e):
            return _finish(spec, report, on_gpu, RANK_OOM_EXIT)
        _finish(spec, report, on_gpu, 1)
        raise
    report["status"] = "stopped" if stop.requested else "done"
    return _finish(spec, report, on_gpu, 0)


def _simulated_oom(spec: dict) -> None:
    """Test hook: the probe rank raises the real OOM error for the stages listed in SFTTEST_OOM_STAGES and
    the micro-batches in SFTTEST_OOM_MICRO_BATCHES, so escalation and the batch search are tested end to
    end on a machine with no GPU to run out of."""
    if spec["mode"] != "probe":
        return
    if spec["stage"] in os.environ.get("SFTTEST_OOM_STAGES", "").split(","):
        raise torch.OutOfMemoryError(f"CUDA out of memory (simulated for ZeRO {spec['stage']} by SFTTEST_OOM_STAGES)")
    if str(spec["settings"]["micro_batch"]) in os.environ.get("SFTTEST_OOM_MICRO_BATCHES", "").split(","):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated for this micro-batch by SFTTEST_OOM_MICRO_BATCHES)")


def _setup_distributed(timeout_s: int) -> bool:
    """Make the process state before the Trainer's arguments, or ranks disagree on the world size on CPU."""
    if torch.cuda.is_available():
        return True  # the Trainer makes it, with ddp_timeout
    # FACTS.md: on CPU the Trainer + DeepSpeed need the gloo state made first, and then told to use it.
    from datetime import timedelta

    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return False


def trainer_arguments(s: dict, mode: str, output_dir: str, ds_config: str | None, max_steps: int, on_gpu: bool,
                      in_rank: bool = True):
    """SFTConfig with the seed's arguments, filled from the resolved settings (also used by `config`)."""
    from trl import SFTConfig

    bf16 = s["precision"] == "bf16" or (s["precision"] == "auto" and on_gpu)
    probe = mode == "probe"
    return SFTConfig(
        output_dir=output_dir,
        deepspeed=ds_config,  # set before the model loads, so ZeRO-3 shards it while loading
        per_device_train_batch_size=s["micro_batch"],
        gradient_accumulation_steps=s["grad_accum"],
        max_length=s["max_length"],
        packing=s["packing"],  # best-fit decreasing, padding-free: position_ids restart per conversation
        num_train_epochs=s["epochs"],
        max_steps=max_steps,
        learning_rate=s["learning_rate"],
        bf16=bf16,
        # transformers 5's name; TRL's config still defaults the deprecated alias gradient_checkpointing to True,
        # which transformers then overwrites with this value (and warns about when this one is unset)
        activation_checkpointing=s["gradient_checkpointing"],
        logging_steps=1 if probe else s["logging_steps"],
        logging_first_step=True,
        save_strategy="no" if probe else "steps",  # a timing run writes no checkpoint
        save_steps=s["save_steps"],
        save_total_limit=s["save_total_limit"],
        seed=s["seed"],
        data_seed=s["seed"],
        report_to="none",
        # A collective waits this long for a lost node's ranks, then fails the job instead of hanging it.
        ddp_timeout=s["node_timeout_seconds"],
        use_liger_kernel=s["liger_kernels"],  # TRL applies the layer kernels only (its fused LM head stays)
        model_init_kwargs={"dtype": torch.bfloat16 if bf16 else torch.float32, "attn_implementation": s["attention"]},
        # On CPU ranks the gloo state made in _setup_distributed must be used (FACTS.md).
        accelerator_config={"use_configured_state": in_rank and not on_gpu},
        **json.loads(s.get("trainer_args") or "{}"),  # checked in settings: none of the above
    )


def build_trainer(spec: dict, on_gpu: bool, stop: StopRequest, report: dict):
    """SFTTrainer on the run's data, with a callback that times steps and watches for a stop."""
    from trl import SFTTrainer

    from .data import load_conversations

    s = spec["settings"]
    config = trainer_arguments(s, spec["mode"], spec["trainer_output_dir"], spec["ds_config"], spec["max_steps"],
                               on_gpu)
    dataset = load_conversations(s["dataset"], s["dataset_split"])
    # TRL 1.16 deprecates use_liger_kernel for kernels fetched from the Hub at run time; the image runs
    # offline, with liger-kernel installed, so its warning would only repeat on every rank.
    warnings.filterwarnings("ignore", message="`use_liger_kernel=True` is deprecated", category=FutureWarning)
    record = {"stage": spec["stage"], "world_size": int(os.environ["WORLD_SIZE"])}
    if spec.get("batch_searched"):  # a resume keeps the split the search chose, not the settings'
        record["batch"] = {k: s[k] for k in ("micro_batch", "grad_accum", "gradient_checkpointing")}
    callback = ProgressCallback(stop, report, record)
    trainer = SFTTrainer(model=s["model"], args=config, train_dataset=dataset, callbacks=[callback])
    callback.trainer = trainer
    # Mirrors Trainer.set_initial_training_values: a partial accumulation window is a step too.
    batches = len(trainer.get_train_dataloader())
    report["steps_per_epoch"] = max(math.ceil(batches / s["grad_accum"]), 1)
    report["conversations"] = len(dataset)
    if int(os.environ.get("RANK", "0")) == 0:
        # What DeepSpeed was given, "auto" values filled by the Trainer (the rest fill at deepspeed_init).
        Path(spec["report_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(spec["report_dir"]) / f"{spec['mode']}-ds_config.json").write_text(
            json.dumps(config.hf_deepspeed_config.config, indent=2, default=str))
    return trainer


class StopRequest:
    """A stop asked for by SIGTERM to this rank, or by the controller's stop file."""

    def __init__(self, stop_file: Path):
        self.stop_file = stop_file
        self.requested = False

    def on_signal(self, signum, frame) -> None:
        print(f"[rank {os.environ.get('RANK', '?')}] SIGTERM: saving a checkpoint at the end of this step",
              file=sys.stderr, flush=True)
        self.requested = True

    def agreed(self) -> bool:
        """True on every rank once any rank was asked to stop (all ranks must save at the same step)."""
        local = self.requested or self.stop_file.exists()
        if not dist.is_initialized():
            return local
        device = "cuda" if torch.cuda.is_available() else "cpu"
        flag = torch.tensor([1.0 if local else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one float per step: negligible next to a step's traffic
        self.requested = bool(flag.item())
        return self.requested


class ProgressCallback(TrainerCallback):
    """Records time and tokens at every optimizer step; turns a stop request into save-and-stop."""

    def __init__(self, stop: StopRequest, report: dict, record: dict):
        self.stop, self.report, self.record, self.trainer = stop, report, record, None
        report["steps"] = []

    def on_step_end(self, args, state, control, **kwargs):
        tokens = getattr(self.trainer, "_total_train_tokens", 0)  # TRL's non-padding count, all ranks
        self.report["steps"].append([state.global_step, time.perf_counter(), int(tokens)])
        if self.stop.agreed():
            control.should_save = args.save_strategy != "no"
            control.should_training_stop = True
        if control.should_save and state.is_world_process_zero:
            # Before the Trainer writes the checkpoint (trainer_state.json last), so a complete checkpoint
            # always says which stage and how many ranks wrote it: a resume must use the same.
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / RECORD).write_text(json.dumps(self.record))
        return control


def _results(trainer, result, stop: StopRequest) -> dict[str, Any]:
    state = trainer.state
    return {
        "global_step": state.global_step,
        "train_runtime": result.metrics.get("train_runtime"),
        "train_loss": result.metrics.get("train_loss"),
        "num_tokens": int(getattr(trainer, "_total_train_tokens", 0)),
        "log_history": state.log_history,
        "stopped": stop.requested,
    }


def _reset_peak_memory(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()  # alloc_retries counts the training's, not the loading's


def _peak_memory(on_gpu: bool) -> dict[str, Any]:
    import resource

    if on_gpu:
        return {"device": torch.cuda.get_device_name(), "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "total_bytes": torch.cuda.get_device_properties(0).total_memory,
                # times the caching allocator freed its cache to satisfy a request: each one stalls the step
                "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}
    # On CPU the closest figure is the process's peak resident memory (ru_maxrss is in KiB on Linux).
    return {"device": "cpu", "peak_reserved_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _finish(spec: dict, report: dict, on_gpu: bool, code: int) -> int:
    rank = int(os.environ.get("RANK", "0"))
    report.update(rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")), **_peak_memory(on_gpu))
    path = Path(spec["report_dir"]) / f"{spec['mode']}-rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    if code == 0 and dist.is_initialized():
        # Without this a rank aborts at exit and the launcher reports failure (FACTS.md).
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    # The deepspeed launcher adds --local_rank=N (also in LOCAL_RANK, which is what the Trainer reads).
    code = main(next(a for a in sys.argv[1:] if not a.startswith("--")))
    # The report is written and the process group destroyed: leave without the interpreter's teardown,
    # where a library thread still running now and then aborts the rank ("terminate called without an
    # active exception"), which the launcher reports as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
