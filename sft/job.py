"""The job, in the controlling process: probe, then train, then report (ranks run in sft/train.py).

Output folder layout:
    OUTPUT/checkpoint-N/   the Trainer's checkpoints (DeepSpeed shards), the newest SFT_SAVE_TOTAL_LIMIT
    OUTPUT/final/          the 16-bit model, loadable by AutoModelForCausalLM.from_pretrained
    OUTPUT/run/            settings.json, ds_config.json, probe.json, summary.json, loss.png, rank reports
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import checkpoints, dsconfig, exitcodes, probe, report
from .launch import Launch, Ranks, detect_ranks
from .settings import Settings
from .train import RANK_OOM_EXIT


@dataclass(frozen=True)
class Paths:
    out: Path

    @property
    def run(self) -> Path:
        return self.out / "run"

    @property
    def final(self) -> Path:
        return self.out / "final"

    @property
    def stop_file(self) -> Path:
        return self.run / "STOP"

    @property
    def summary(self) -> Path:
        return self.run / "summary.json"


class Stopper:
    """SIGTERM/SIGINT handling for the controller: forward a stop to the ranks running now."""

    def __init__(self):
        self.requested = False
        self.launch: Launch | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame) -> None:
        print(f"received {signal.Signals(signum).name}", flush=True)
        self.requested = True
        if self.launch is not None:
            self.launch.stop()


def finished(paths: Paths) -> bool:
    done = report.read_json(paths.summary)
    return bool(done and done.get("status") == "done" and (paths.final / "config.json").is_file())


def run(s: Settings, probe_only: bool = False) -> int:
    """The whole job; returns its exit code."""
    paths = Paths(s.output_path)
    if finished(paths) and not probe_only:
        print(f"{paths.final} is already trained (see {paths.summary}); nothing to do.", flush=True)
        return exitcodes.DONE
    ranks = detect_ranks(s)
    stopper = Stopper()
    stopper.install()
    paths.stop_file.unlink(missing_ok=True)  # a stop of an earlier start must not stop this one
    report.write_json(paths.run / "settings.json", s.to_dict())
    stage = s.zero_stage if s.ds_config is None else dsconfig.stage_of(dsconfig.load("", s.ds_config))
    ds_path = dsconfig.write(dsconfig.load(s.zero_stage, s.ds_config), paths.run / "ds_config.json")
    resume = checkpoints.latest_complete(paths.out)
    summary: dict[str, Any] = {"settings": s.to_dict(), "stage": stage, "ranks": ranks.count,
                               "resumed_from": str(resume) if resume else None}
    if s.probe_steps > 0 and resume is None:
        code, fig = run_probe(s, ranks, paths, ds_path, stage, stopper)
        summary["probe"] = fig
        if code != exitcodes.DONE or probe_only:
            return _close(paths, summary, code, "probed" if code == exitcodes.DONE else "probe failed")
    elif probe_only:
        print("SFT_PROBE_STEPS=0: nothing to probe", flush=True)
        return exitcodes.DONE
    else:
        summary["probe"] = report.read_json(paths.run / "probe.json")
    code, train = run_training(s, ranks, paths, ds_path, resume, stopper)
    summary["train"] = train
    status = {exitcodes.DONE: "done", exitcodes.STOPPED: "stopped"}.get(code, "failed")
    return _close(paths, summary, code, status)


def _spec(s: Settings, paths: Paths, mode: str, ds_path: Path, **extra: Any) -> Path:
    spec = {"settings": s.to_dict(), "mode": mode, "ds_config": str(ds_path), "stop_file": str(paths.stop_file),
            "report_dir": str(paths.run / "reports"), "final_dir": str(paths.final), **extra}
    for old in (paths.run / "reports").glob(f"{mode}-rank*.json"):
        old.unlink()  # reports of an earlier start would be mistaken for this one's
    return report.write_json(paths.run / f"spec-{mode}.json", spec)


def _rank_reports(paths: Paths, mode: str) -> list[dict[str, Any]]:
    found = [report.read_json(p) for p in sorted((paths.run / "reports").glob(f"{mode}-rank*.json"))]
    return [r for r in found if r]


def run_probe(s: Settings, ranks: Ranks, paths: Paths, ds_path: Path, stage: str,
              stopper: Stopper) -> tuple[int, dict[str, Any] | None]:
    """The timing run: SFT_PROBE_STEPS optimizer steps, no checkpoint."""
    print(f"probe: {s.probe_steps} steps with ZeRO {stage} on {ranks.count} rank(s)", flush=True)
    spec = _spec(s, paths, "probe", ds_path, trainer_output_dir=str(paths.run / "probe"), max_steps=s.probe_steps)
    code = _launch(s, ranks, spec, paths, stopper)
    reports = _rank_reports(paths, "probe")
    if stopper.requested:
        return exitcodes.STOPPED, None
    if code != 0 or len(reports) != ranks.count or any(r["status"] != "done" for r in reports):
        if code == RANK_OOM_EXIT or any(r.get("status") == "oom" for r in reports):
            nxt = dsconfig.next_stage(stage) if stage in dsconfig.ESCALATION else None
            hint = f"try SFT_ZERO_STAGE={nxt}" if nxt else "lower SFT_MICRO_BATCH or SFT_MAX_LENGTH"
            print(f"error: the probe ran out of GPU memory with ZeRO {stage}; {hint}", flush=True)
            return exitcodes.PROBE_OOM, None
        print(f"error: the probe failed (launcher exit code {code}); see the ranks' output above", flush=True)
        return exitcodes.PROBE_FAILED, None
    fig = probe.figures(reports, s.to_dict())
    report.write_json(paths.run / "probe.json", fig)
    print("probe:\n" + probe.table(fig), flush=True)
    return exitcodes.DONE, fig


def run_training(s: Settings, ranks: Ranks, paths: Paths, ds_path: Path, resume: Path | None,
                 stopper: Stopper) -> tuple[int, dict[str, Any]]:
    """The full run: epochs, checkpoints, final model."""
    if stopper.requested:
        return exitcodes.STOPPED, {}
    print(f"train: resuming from {resume}" if resume else "train: from the start", flush=True)
    spec = _spec(s, paths, "train", ds_path, trainer_output_dir=str(paths.out), max_steps=s.max_steps,
                 resume=str(resume) if resume else None)
    started = time.time()
    code = _launch(s, ranks, spec, paths, stopper)
    reports = _rank_reports(paths, "train")
    main = next((r for r in reports if r["rank"] == 0), {})
    result = {
        "wall_seconds": round(time.time() - started, 1),
        "global_step": main.get("global_step"),
        "train_runtime": main.get("train_runtime"),
        "train_loss": main.get("train_loss"),
        "num_tokens": main.get("num_tokens"),
        "peak_reserved_gib": [round(r["peak_reserved_bytes"] / probe.GIB, 2) for r in reports],
        "log_history": main.get("log_history", []),
    }
    if main.get("num_tokens") and main.get("train_runtime"):
        result["tokens_per_second"] = round(main["num_tokens"] / main["train_runtime"], 1)
    if stopper.requested or main.get("status") == "stopped":
        return exitcodes.STOPPED, result
    if code != 0 or main.get("status") != "done":
        print(f"error: training failed (launcher exit code {code}); complete checkpoints are kept and a new "
              f"start resumes from the newest", flush=True)
        return exitcodes.TRAIN_FAILED, result
    return exitcodes.DONE, result


def _launch(s: Settings, ranks: Ranks, spec: Path, paths: Paths, stopper: Stopper) -> int:
    launch = Launch(s, ranks, spec, paths.stop_file)
    stopper.launch = launch
    try:
        return launch.run()
    finally:
        stopper.launch = None


def _close(paths: Paths, summary: dict[str, Any], code: int, status: str) -> int:
    summary.update(status=status, exit_code=code)
    train = summary.get("train") or {}
    points = report.losses(train.get("log_history", []))
    if points:
        summary["final_loss"] = points[-1][1]
        report.plot_loss(points, paths.run / "loss.png", f"{summary['settings']['model']} (ZeRO {summary['stage']})")
    report.write_json(paths.summary, summary)
    print(f"{status}: exit code {code}; summary in {paths.summary}", flush=True)
    return code
