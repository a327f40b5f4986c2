"""What every rank runs: TRL's SFTTrainer on DeepSpeed, as the seed's sft_ds.py does.

Started by the launcher (torchrun or deepspeed), never by hand:
    python -m sft.ranks.train RUN_SPEC.json
The controller writes RUN_SPEC.json (a RunSpec); each rank writes a RankReport back, however it ends.
Exit codes of a rank: 0 done (or stopped on request, said in the report), exitcodes.RANK_OOM.
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

from .. import exitcodes
from ..handoff import CheckpointRecord, RankReport, RunSpec
from ..lifeline import die_with_parent
from . import devtools, evaluation, final, patches, trackers
from .patches import reads, seqpar, universal
from .hold import Hold
from .cadence import SaveClock
from .progress import ProgressCallback, StopRequest


def main(spec_path: str) -> int:
    die_with_parent()  # a rank whose launcher was killed must not train on alone
    spec = RunSpec.load(Path(spec_path))
    on_gpu = _setup_distributed(spec.node_timeout_seconds)
    stop = StopRequest(Path(spec.stop_file))
    signal.signal(signal.SIGTERM, stop.on_signal)
    report = RankReport(mode=spec.mode)
    try:
        trainer = build_trainer(spec, on_gpu, stop, report, dev := devtools.load())
        report.tokens_before = _resumed_tokens(trainer, spec)
        if dev is not None:
            dev.before_training(spec)
        _reset_peak_memory(on_gpu)
        result = trainer.train(resume_from_checkpoint=spec.resume)
        report.ended_wall["trained"] = time.time()
        if trainer.eval_dataset is not None and spec.mode == "probe":
            evaluation.timed(trainer, report)
        ended = report.status == "ended"  # by the probe's verdict: the controller relaunches or closes
        evaluation.at_the_end(trainer, spec, stop.requested or ended)
        _results(report, trainer, result, stop)
        if spec.mode == "train" and not stop.requested and not ended:
            final.save(trainer, spec.final_dir, _progress(trainer).saved_step)  # the end's checkpoint's files
            report.ended_wall["final"] = time.time()
        if (writer := patches.background.writer()) is not None:
            finished = spec.mode == "train" and not stop.requested and not ended
            writer.wait(files_only=finished)  # else the retired checkpoints' removal too, behind the final model
            if finished:  # nothing follows but the rank's end: the removal goes on behind it
                patches.background.removal_behind(Path(trainer.args.output_dir), trainer.args.should_save)
        report.ended_wall["written"] = time.time()
    except Exception as e:  # every failure is reported to the controller, then re-raised
        _written_before_failing()
        oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
        report.status, report.error = ("oom" if oom else "failed"), f"{type(e).__name__}: {e}"
        if oom:
            return _finish(spec, report, on_gpu, exitcodes.RANK_OOM)
        _finish(spec, report, on_gpu, 1)
        raise
    report.status = "stopped" if stop.requested else "ended" if ended else "done"
    return _finish(spec, report, on_gpu, 0)


def _progress(trainer) -> ProgressCallback:
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback))


def _written_before_failing() -> None:
    """A checkpoint still being written in the background is finished before a failed rank ends, so the failure
    leaves it whole (a failed write's own error is the one already raised)."""
    writer = patches.background.writer()
    if writer is not None:
        try:
            writer.wait()
        except OSError:
            pass


def _setup_distributed(timeout_s: int) -> bool:
    """Make the process state before the Trainer's arguments, or ranks disagree on the world size on CPU."""
    if torch.cuda.is_available():
        return True  # the Trainer makes it, with ddp_timeout
    # On CPU the Trainer + DeepSpeed need the gloo state made first, and then told to use it (docs/facts.md).
    from datetime import timedelta

    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return False


def build_trainer(spec: RunSpec, on_gpu: bool, stop: StopRequest, report: RankReport, dev=None):
    """SFTTrainer on the run's data (its step's numbers read without waiting on the GPU: reads.py), with a
    callback that times steps and watches for a stop."""
    from .. import tracking
    from ..data.sources import build
    if spec.mode == "train":  # each tracker's files under OUTPUT/run/, unless the user pointed it elsewhere
        for variable, value in tracking.environment(spec.report_to, Path(spec.run_dir)).items():
            os.environ.setdefault(variable, value)
    config = spec.sft_config()
    if spec.compile:
        regional_compilation()  # read when SFTTrainer makes its Accelerator, below
    patches.apply(spec)  # the libraries' fixes this run needs (sft/ranks/patches/)
    dataset, eval_dataset = build(spec.data)  # as the controller built and checked them
    # TRL deprecates use_liger_kernel for kernels fetched from the Hub at run time; the image runs
    # offline, with liger-kernel installed, so its warning would only repeat on every rank.
    warnings.filterwarnings("ignore", message="`use_liger_kernel=True` is deprecated", category=FutureWarning)
    rank0_of_training = spec.mode == "train" and int(os.environ.get("RANK", "0")) == 0 and spec.run_dir
    clock = SaveClock(spec.save_seconds, spec.hold_at, int(os.environ.get("RANK", "0")) == 0, spec.evaluates_with_saves)
    callback = ProgressCallback(stop, report, spec.record, Path(spec.run_dir) if rank0_of_training else None, clock)
    if spec.hold_at:  # this training launch is also the probe: after its steps, the controller's verdict
        callback.hold = Hold(spec, report, lambda r: _stamp(r, on_gpu),
                             stop_asked=lambda: stop.requested or stop.stop_file.exists())
    # a developer's tools (dev: sft/dev/, where one asked) around the rank's own; a universal checkpoint's load
    # repaired (nothing otherwise)
    callbacks = [*(dev.callbacks_first() if dev else []), callback, *(dev.callbacks_last(spec) if dev else []),
                 universal.OwnSteps(), trackers.RecordRuns(Path(spec.run_dir)) if rank0_of_training else None]
    trainer = reads.trainer_class()(model=spec.model, args=config, train_dataset=dataset, eval_dataset=eval_dataset,
                         callbacks=[c for c in callbacks if c is not None])
    for c in callbacks:
        if c is not None:
            c.trainer = trainer
    if spec.sequence_parallel > 1:
        seqpar.install(trainer)
    if dev is not None:
        dev.with_trainer(trainer, spec)
    # Mirrors Trainer.set_initial_training_values: a partial accumulation window is a step too, and with rows
    # split over N GPUs each group takes its N ranks' batches in turn (DeepSpeed's UlyssesSPDataLoaderAdapter).
    batches = len(trainer.get_train_dataloader()) * spec.sequence_parallel
    report.steps_per_epoch = max(math.ceil(batches / spec.grad_accum), 1)
    report.conversations = len(dataset)
    report.eval_rows = len(trainer.eval_dataset) if trainer.eval_dataset is not None else None
    if int(os.environ.get("RANK", "0")) == 0:
        # What DeepSpeed was given, "auto" values filled by the Trainer (the rest fill at deepspeed_init).
        Path(spec.report_dir).mkdir(parents=True, exist_ok=True)
        (Path(spec.report_dir) / f"{spec.mode}-ds_config.json").write_text(
            json.dumps(config.hf_deepspeed_config.config, indent=2, default=str))
    return trainer


def regional_compilation() -> None:
    """Compile each decoder layer, not the whole model: accelerate's regional compilation (its
    compile_regions_deepspeed, which compiles the DeepSpeed engine's module in place). One layer's graph serves all of
    them, the model's forward (its mask, TRL's fused LM head) stays eager, and it ran the defaults faster than
    uncompiled with Liger's kernels, where the whole model compiled through DeepSpeed's engine.compile never finished
    warming up in the time it was given (measured: docs/speed.md, 'each decoder layer compiled, Liger's kernels off').
    Accelerate reads it from the environment only, when the Trainer makes its Accelerator: call it in the rank,
    before."""
    os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "1"


def _resumed_tokens(trainer, spec: RunSpec) -> int:
    """TRL counts the tokens trained on from zero in each process: a resume goes on from its checkpoint's count
    (recorded by ProgressCallback), so its num_tokens logs and the summary count the whole run."""
    record = CheckpointRecord.load(Path(spec.resume) / CheckpointRecord.FILE) if spec.resume else None
    tokens = (record.tokens or 0) if record else 0
    trainer._total_train_tokens = tokens  # SFTTrainer's counter (no public setter); its num_tokens metric reads it
    return tokens


def _results(report: RankReport, trainer, result, stop: StopRequest) -> None:
    report.global_step = trainer.state.global_step
    report.train_runtime = result.metrics.get("train_runtime")
    report.train_loss = result.metrics.get("train_loss")
    report.num_tokens = int(getattr(trainer, "_total_train_tokens", 0))
    report.log_history = trainer.state.log_history
    report.stopped = stop.requested


def _reset_peak_memory(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()  # alloc_retries counts the training's, not the loading's


def _memory(report: RankReport, on_gpu: bool) -> None:
    import resource

    if not on_gpu:  # the closest figure: the process's peak resident memory (ru_maxrss is in KiB on Linux)
        report.device, report.peak_reserved_bytes = "cpu", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return
    report.device = torch.cuda.get_device_name()
    report.peak_reserved_bytes = torch.cuda.max_memory_reserved()
    report.peak_allocated_bytes = torch.cuda.max_memory_allocated()
    report.total_bytes = torch.cuda.get_device_properties(0).total_memory
    # times the caching allocator freed its cache to satisfy a request: each one stalls the step
    report.alloc_retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)


def _stamp(report: RankReport, on_gpu: bool) -> None:
    """The rank's place and its memory, as a report ends."""
    report.rank, report.world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    _memory(report, on_gpu)


def _finish(spec: RunSpec, report: RankReport, on_gpu: bool, code: int) -> int:
    trackers.close(code)
    _stamp(report, on_gpu)
    report.ended_wall["reported"] = time.time()
    try:
        report.save(RankReport.path(Path(spec.report_dir), spec.mode, report.rank))
    except OSError as e:  # a full or read-only disk: the controller finds the report missing and looks at the disk;
        # said here in one line, not as a second traceback inside the first failure's
        print(f"rank {report.rank}: could not write its report in {spec.report_dir} ({e.strerror or e}); it "
              f"{report.status or 'ended'}{f': {report.error}' if report.error else ''}", file=sys.stderr, flush=True)
        code = code or 1
    if code == 0 and dist.is_initialized():
        # Without this a rank aborts at exit and the launcher reports failure (docs/facts.md).
        dist.destroy_process_group()
    return code


def _entry(argv: list[str]) -> Any:
    # The deepspeed launcher adds --local_rank=N (also in LOCAL_RANK, which is what the Trainer reads).
    return main(next(a for a in argv if not a.startswith("--")))


if __name__ == "__main__":
    code = _entry(sys.argv[1:])
    # The report is written and the process group destroyed: leave without the interpreter's teardown,
    # where a library thread still running now and then aborts the rank ("terminate called without an
    # active exception"), which the launcher reports as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
