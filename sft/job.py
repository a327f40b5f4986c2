"""The job, in the controlling process: hub → preflight → plan → probe → train → upload → summary.

Ranks run in sft/train.py; this process starts them through the launcher, watches for SIGTERM and
uploads checkpoints in the background. Output folder layout:
    OUTPUT/checkpoint-N/   the Trainer's checkpoints (DeepSpeed shards), the newest SFT_SAVE_TOTAL_LIMIT
    OUTPUT/final/          the 16-bit model, loadable by AutoModelForCausalLM.from_pretrained
    OUTPUT/run/            settings.json, ds_config.json, probe.json, summary.json, loss.png, rank reports
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import checkpoints, coordinate, dsconfig, exitcodes, nodes, probe, report
from .launch import Launch, Ranks, detect_ranks
from .plan import GIB
from .settings import Settings, liger_available
from .train import RANK_OOM_EXIT

BATCH_SEARCH_TRIES = 3  # splits timed at most: each loads the model once more
BATCH_SEARCH_STEPS = 12  # steps per split: steady_rates times the last 8 (probe.WARMUP_STEPS)


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
    """SIGTERM/SIGINT in the controller: forward a stop to the ranks running now, remember when."""

    def __init__(self):
        self.requested_at: float | None = None
        self.launch: Launch | None = None

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame) -> None:
        print(f"received {signal.Signals(signum).name}", flush=True)
        self.requested_at = self.requested_at or time.monotonic()
        if self.launch is not None:
            self.launch.stop()


class ProbeOutOfMemory(Exception):
    """The probe's ranks ran out of GPU memory, or left less free than the planner's margin."""


def finished(paths: Paths) -> bool:
    done = report.read_json(paths.summary)
    return bool(done and done.get("status") == "done" and (paths.final / "config.json").is_file())


def run(s: Settings, probe_only: bool = False) -> int:
    """The whole job; returns its exit code. Node 0 runs it; other nodes start their ranks as node 0 says."""
    where = nodes.from_env(os.environ)
    try:
        team = coordinate.join(s, where, detect_ranks(s, where.nnodes))
    except coordinate.NodesFailed as e:
        print(f"error: {e}", flush=True)
        return exitcodes.PREFLIGHT
    if not team.leads:
        return team.follow(Stopper())
    code = exitcodes.FAILED  # an exception here must still release the other nodes
    try:
        code = Job(s, team).run(probe_only)
    finally:
        team.finish(code)
    return code


class Job:
    """One start of the job: what it decided and measured, gathered into the summary."""

    def __init__(self, s: Settings, team: coordinate.Team):
        self.s, self.paths, self.stopper = s, Paths(s.output_path), Stopper()
        self.team, self.ranks = team, team.ranks
        # the split of the rows per step: the settings', or the batch search's, or a resumed checkpoint's
        self.micro_batch, self.grad_accum, self.batch_searched = s.micro_batch, s.grad_accum, False
        self.summary: dict[str, Any] = {"settings": s.to_dict(), "nodes": team.nodes.nnodes, "escalations": []}
        self.target = None  # the Hub repo, once preflight checked it
        self.uploader = None

    def run(self, probe_only: bool) -> int:
        from .hub.errors import HubError

        try:
            self.target = self._connect_hub()
            if not probe_only and self._already_done():
                return exitcodes.DONE
            self.stopper.install()
            self.paths.stop_file.unlink(missing_ok=True)  # a stop of an earlier start must not stop this one
            report.write_json(self.paths.run / "settings.json", self.s.to_dict())
            resume = self._resume_point()
        except HubError as e:
            print(f"error: {e.message}", flush=True)
            return e.exit_code
        code = self._preflight_and_plan(resume, probe_only)
        if code is not None:
            return self._close(code, "preflight failed")
        if self.s.probe_steps > 0 and resume is None:
            code = self._search_batch() if self._batch_search_on() else exitcodes.DONE
            if code == exitcodes.DONE:
                code = self._probe()
            if code != exitcodes.DONE or probe_only:
                return self._close(code, "probed" if code == exitcodes.DONE else "probe failed")
        elif probe_only:
            print("nothing to probe (SFT_PROBE_STEPS=0, or resuming a run already probed)", flush=True)
            return exitcodes.DONE
        return self._train(resume)

    # -- the Hub ---------------------------------------------------------------------------------

    def _connect_hub(self):
        """Check the token and the private repo before any GPU work; None when no repo is named."""
        from .hub.preflight import preflight

        if self.s.hub_repo is None:
            print("no SFT_HUB_REPO: checkpoints stay on this disk only (nothing is uploaded)", flush=True)
            return None
        target = preflight(self.s.hub_repo, os.environ.get("HF_TOKEN"))
        print(f"hub: uploading to {target.url} every {self.s.upload_minutes:g} min", flush=True)
        return target

    def _already_done(self) -> bool:
        from .hub import resume as hub_resume

        if finished(self.paths):
            print(f"{self.paths.final} is already trained (see {self.paths.summary}); nothing to do.", flush=True)
            return True
        if self.target is not None and hub_resume.final_on_hub(self.target.api, self.target.repo_id):
            print(f"the final model is already on {self.target.url}; nothing to do.", flush=True)
            return True
        return False

    def _resume_point(self) -> Path | None:
        """The newest complete checkpoint on disk; else, with a repo, the newest verified one on the Hub."""
        from .hub import resume as hub_resume

        resume = checkpoints.latest_complete(self.paths.out)
        if resume is None and self.target is not None:
            resume = hub_resume.resume_from_hub(self.target.api, self.target.repo_id, self.paths.out)
        self.summary["resumed_from"] = str(resume) if resume else None
        return resume

    # -- preflight and the plan -----------------------------------------------------------------

    def _preflight_and_plan(self, resume: Path | None, probe_only: bool) -> int | None:
        """Machine checks, then the stage: the checkpoint's on resume, else the user's or the plan's."""
        from . import plan, preflight

        shape = plan.model_shape(self.s.model)
        searched = checkpoints.recorded(resume).get("batch") if resume else None
        if searched:  # the batch search chose it: the resumed run keeps the same split
            self.micro_batch, self.grad_accum = searched["micro_batch"], searched["grad_accum"]
            self.batch_searched = True
            print(f"batch: {self.micro_batch} x {self.grad_accum}, as the batch search chose it for {resume.name}",
                  flush=True)
        self.plan = self._plan(shape, searched["gradient_checkpointing"] if searched else None)
        offload_row = self.plan.row("3-offload")
        checks = preflight.run_preflight(
            str(self.paths.out), zero_stage=self.s.zero_stage if self.s.ds_config is None else "3",
            # the probe alone writes no checkpoint: its disk needs are not the run's
            total_params=None if probe_only else shape.total_params, save_total_limit=self.s.save_total_limit,
            host_needed_bytes=offload_row.host if offload_row else None, gpus_wanted=self.ranks.count,
            allreduce=self.ranks.count > 1 and self.ranks.on_gpu)
        print("preflight:\n" + preflight.format_checks(checks), flush=True)
        self.summary["preflight"] = [dict(name=c.name, status=c.status, message=c.message) for c in checks]
        self.pin_memory = preflight.pin_memory(checks)
        if preflight.failed(checks):
            print("error: preflight found problems that make this run impossible (above)", flush=True)
            return exitcodes.PREFLIGHT
        if resume is not None and checkpoints.recorded(resume).get("world_size", self.ranks.world) != self.ranks.world:
            print(f"error: {resume.name} was written by {checkpoints.recorded(resume)['world_size']} ranks and this "
                  f"start has {self.ranks.world}. DeepSpeed cannot load ZeRO shards into another number of ranks: "
                  f"start on as many GPUs (SFT_GPUS), or convert the checkpoint with DeepSpeed's universal "
                  f"checkpointing (python -m deepspeed.checkpoint.ds_to_universal) first", flush=True)
            return exitcodes.PREFLIGHT
        self.stage = self._first_stage(resume)
        if self.stage is None:
            print(f"error: no ZeRO option fits this machine: {self.plan.reason}", flush=True)
            return exitcodes.PREFLIGHT
        return None

    def _plan(self, shape, checkpointing: bool | None = None):
        """The plan for the settings; with SFT_GRADIENT_CHECKPOINTING=auto, off where the stage still fits
        (checkpointing given: as a resumed checkpoint's batch search decided it)."""
        from . import plan

        # the machine, the configs and Liger once: the plan is made again for auto checkpointing and
        # for each split the batch search considers
        gpu_memory, host_memory = _rank_memory_gib(self.ranks), _host_memory_gib()
        configs = {o: dsconfig.load(o) for o in dsconfig.FILES}
        liger = liger_on(self.s, self.ranks)

        def make(checkpointing: bool, micro_batch: int = 0, grad_accum: int = 0):
            return plan.plan_from_shape(shape, self.ranks.count, gpu_memory, nodes=self.ranks.nodes,
                                        micro_batch=micro_batch or self.micro_batch, max_length=self.s.max_length,
                                        gradient_checkpointing=checkpointing, host_memory_gib=host_memory,
                                        ds_configs=configs, grad_accum=grad_accum or self.grad_accum,
                                        liger_kernels=liger)

        self._make_plan = make  # the batch search plans its candidates the same way
        setting = self.s.gradient_checkpointing
        decide = setting == "auto" and checkpointing is None  # a resumed batch search's choice stands
        self.checkpointing = setting != "false" if checkpointing is None else checkpointing
        p = make(self.checkpointing)
        stage = self._explicit_stage() or p.choice
        if decide and stage in dsconfig.FILES:
            without = make(False)
            if without.row(stage).fits:  # recomputing activations costs a third more compute: skip it if it fits
                p, self.checkpointing = without, False
        print(plan.format_table(p), flush=True)
        print(f"gradient checkpointing: {'on' if self.checkpointing else 'off'}"
              + (" (auto)" if setting == "auto" else ""), flush=True)
        self.summary["plan"] = p.to_dict()
        return p

    def _explicit_stage(self) -> str | None:
        if self.s.ds_config is not None:
            return dsconfig.stage_of(dsconfig.load("", self.s.ds_config))
        return None if self.s.zero_stage == "auto" else self.s.zero_stage

    def resolved(self) -> dict[str, Any]:
        """The settings with every auto decided: what the ranks are given and the summary records."""
        return resolve(self.s, self.ranks, self.checkpointing, (self.micro_batch, self.grad_accum))

    def _first_stage(self, resume: Path | None) -> str | None:
        recorded = checkpoints.recorded(resume).get("stage") if resume else None
        if recorded and self.s.ds_config is None:
            print(f"stage: ZeRO {recorded}, as the checkpoint was written", flush=True)
            return recorded
        if explicit := self._explicit_stage():
            return explicit
        print(f"stage: auto picks ZeRO {self.plan.choice}: {self.plan.reason}", flush=True)
        return self.plan.choice

    # -- the probe ------------------------------------------------------------------------------

    def _probe(self) -> int:
        """The timing run; with SFT_ZERO_STAGE=auto, the next option when the stage does not fit."""
        while True:
            try:
                return self._probe_once()
            except ProbeOutOfMemory as e:
                if self.s.gradient_checkpointing == "auto" and not self.checkpointing:
                    print(f"auto: {e} with ZeRO {self.stage}; turning gradient checkpointing on and probing again",
                          flush=True)
                    self.summary["escalations"].append({"from": "checkpointing off", "to": "on", "why": str(e)})
                    self.checkpointing = True
                    continue
                nxt = self._next_option()
                if self.s.zero_stage != "auto" or self.s.ds_config is not None or nxt is None:
                    hint = f"try SFT_ZERO_STAGE={nxt}" if nxt else "lower SFT_MICRO_BATCH or SFT_MAX_LENGTH"
                    print(f"error: {e} with ZeRO {self.stage}; {hint}", flush=True)
                    return exitcodes.PROBE_OOM
                print(f"auto: {e} with ZeRO {self.stage}; moving to ZeRO {nxt} and probing again", flush=True)
                self.summary["escalations"].append({"from": self.stage, "to": nxt, "why": str(e)})
                self.stage = nxt

    def _next_option(self) -> str | None:
        """The option that holds less on each GPU (ZeRO-2 after 1, 3 after 2, then offload)."""
        return dsconfig.next_stage(self.stage) if self.stage in dsconfig.ESCALATION else None

    def _probe_once(self) -> int:
        s = self.s
        print(f"probe: {s.probe_steps} steps with ZeRO {self.stage} on {self.ranks.world} rank(s)", flush=True)
        code, fig, reports = self._timed_run(s.probe_steps, "probe")
        if code != exitcodes.DONE:
            return code
        report.write_json(self.paths.run / "probe.json", fig)
        self.summary["probe"] = fig
        print("probe:\n" + probe.table(fig), flush=True)
        self._check_headroom(reports)
        return exitcodes.DONE

    def _timed_run(self, steps: int, name: str) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
        """Ranks that train `steps` steps and save nothing; their figures and reports. Raises
        ProbeOutOfMemory when a rank runs out of memory."""
        spec = self._spec("probe", trainer_output_dir=str(self.paths.run / name.replace(" ", "-")), max_steps=steps)
        code = self._launch(spec)
        reports = self._rank_reports("probe")
        if self.stopper.requested:
            return exitcodes.STOPPED, {}, reports
        if code == RANK_OOM_EXIT or any(r.get("status") == "oom" for r in reports):
            raise ProbeOutOfMemory(f"the {name} ran out of GPU memory")
        if code != 0 or len(reports) != self.ranks.world or any(r["status"] != "done" for r in reports):
            print(f"error: the {name} failed (launcher exit code {code}); see the ranks' output above", flush=True)
            return exitcodes.PROBE_FAILED, {}, reports
        fig = probe.figures(reports, self.resolved())
        fig["stage"] = self.stage
        return exitcodes.DONE, fig, reports

    # -- the batch search -----------------------------------------------------------------------

    def _batch_search_on(self) -> bool:
        return self.s.batch_search == "true" or (self.s.batch_search == "auto" and self.ranks.on_gpu)

    def _batch_candidates(self) -> list[tuple[int, int, bool]]:
        rows = self.s.micro_batch * self.s.grad_accum
        setting = self.s.gradient_checkpointing
        return batch_candidates(
            rows, (False, True) if setting == "auto" else (setting == "true",),
            fits=lambda mb, checkpointing: self._make_plan(checkpointing, mb, rows // mb).row(self.stage).fits_gpu,
            every=self.s.batch_search == "true")

    def _search_batch(self) -> int:
        """Time each candidate split in a short run; keep the fastest that did not run out of memory."""
        candidates = self._batch_candidates()
        if len(candidates) < 2:  # nothing to choose between: the probe decides as before
            if candidates:
                mb, accum, checkpointing = candidates[0]
                print(f"batch search: {split_text(mb, accum, checkpointing)}, is the one split of {mb * accum} rows "
                      f"per step that can be the fastest; nothing to time", flush=True)
                if (mb, accum, checkpointing) != (self.micro_batch, self.grad_accum, self.checkpointing):
                    # the planned split does not fit this stage: this one does (a resume keeps it)
                    self.micro_batch, self.grad_accum, self.checkpointing = mb, accum, checkpointing
                    self.batch_searched = True
            return exitcodes.DONE
        search_started = time.monotonic()
        steps = min(self.s.probe_steps, BATCH_SEARCH_STEPS)
        print(f"batch search: {len(candidates)} splits of {self.s.micro_batch * self.s.grad_accum} rows per "
              f"step, {steps} steps each, with ZeRO {self.stage}", flush=True)
        planned, tries = (self.micro_batch, self.grad_accum, self.checkpointing), []
        for mb, accum, checkpointing in candidates:
            self.micro_batch, self.grad_accum, self.checkpointing = mb, accum, checkpointing
            tried = {"micro_batch": mb, "grad_accum": accum, "gradient_checkpointing": checkpointing}
            started = time.monotonic()
            try:
                code, fig, reports = self._timed_run(steps, "batch search")
                if code == exitcodes.DONE:
                    self._check_headroom(reports)
            except ProbeOutOfMemory as e:
                code, fig, tried["out_of_memory"] = exitcodes.DONE, {}, str(e)
            if code != exitcodes.DONE:
                return code
            tried["tokens_per_second"] = fig.get("tokens_per_second")
            tried["peak_reserved_gib"] = fig.get("peak_reserved_gib")
            tried["wall_seconds"] = round(time.monotonic() - started, 1)  # what the try cost, model load included
            tries.append(tried)
            print(f"batch search: {split_text(mb, accum, checkpointing)}: "
                  + (f"{tried['tokens_per_second']:,.0f} tokens/s" if tried["tokens_per_second"] else
                     tried.get("out_of_memory", "too few steps to time")), flush=True)
        timed = [t for t in tries if t["tokens_per_second"]]
        self.summary["batch_search"] = {"rows_per_step": self.s.micro_batch * self.s.grad_accum, "steps": steps,
                                        "tries": tries}
        if not timed:  # every split failed: the planned one, and the probe's usual escalation
            self.micro_batch, self.grad_accum, self.checkpointing = planned
            print("batch search: no split could be timed; probing the planned one", flush=True)
            return exitcodes.DONE
        best = max(timed, key=lambda t: t["tokens_per_second"])
        self.micro_batch, self.grad_accum = best["micro_batch"], best["grad_accum"]
        self.checkpointing, self.batch_searched = best["gradient_checkpointing"], True
        self.summary["batch_search"]["chosen"] = best
        self.summary["batch_search"]["wall_seconds"] = round(time.monotonic() - search_started, 1)
        print(f"batch search: keeping {split_text(self.micro_batch, self.grad_accum, self.checkpointing)} "
              f"({self.summary['batch_search']['wall_seconds']:.0f} s spent searching)", flush=True)
        return exitcodes.DONE

    def _check_headroom(self, reports: list[dict[str, Any]]) -> None:
        """Measured peak against the card: less free than the planner's margin counts as not fitting."""
        from .plan import GPU_FREE_FRACTION

        for r in reports:
            total = r.get("total_bytes")
            if total and r["peak_reserved_bytes"] > total * (1 - GPU_FREE_FRACTION):
                raise ProbeOutOfMemory(f"rank {r['rank']} peaked at {r['peak_reserved_bytes'] / GIB:.1f} GiB of "
                                       f"{total / GIB:.1f} GiB, less than {GPU_FREE_FRACTION:.0%} free")

    # -- training -------------------------------------------------------------------------------

    def _train(self, resume: Path | None) -> int:
        from .hub.uploader import Uploader

        if self.stopper.requested:
            return self._close(exitcodes.STOPPED, "stopped")
        print(f"train: ZeRO {self.stage}, " + (f"resuming from {resume}" if resume else "from the start"), flush=True)
        if self.target is not None:
            self.uploader = Uploader(self.target, self.paths.out, interval_s=self.s.upload_minutes * 60,
                                     keep=self.s.save_total_limit)
            self.uploader.start()
        spec = self._spec("train", trainer_output_dir=str(self.paths.out), max_steps=self.s.max_steps,
                          resume=str(resume) if resume else None)
        started = time.time()
        code = self._launch(spec)
        self.summary["train"] = train = self._train_results(time.time() - started)
        if (check := probe.against_run(self.summary.get("probe") or {}, train)) is not None:
            self.summary["probe_check"] = check
            print(probe.against_run_line(check), flush=True)
        if self.stopper.requested or train.get("status") == "stopped":
            return self._close(exitcodes.STOPPED, "stopped")
        if code != 0 or train.get("status") != "done":
            print(f"error: training failed (launcher exit code {code}); complete checkpoints are kept and a new "
                  f"start resumes from the newest", flush=True)
            return self._close(exitcodes.TRAIN_FAILED, "failed")
        return self._close(exitcodes.DONE, "done")

    def _train_results(self, wall: float) -> dict[str, Any]:
        reports = self._rank_reports("train")
        main = next((r for r in reports if r["rank"] == 0), {})
        result = {key: main.get(key) for key in ("status", "global_step", "train_runtime", "train_loss",
                                                  "num_tokens", "log_history")}
        result["wall_seconds"] = round(wall, 1)
        result["peak_reserved_gib"] = [round(r["peak_reserved_bytes"] / GIB, 2) for r in reports]
        if main.get("num_tokens") and main.get("train_runtime"):
            result["tokens_per_second"] = round(main["num_tokens"] / main["train_runtime"], 1)
        if rates := probe.steady_rates(main.get("steps", [])):
            result["steady_tokens_per_second"] = rates["tokens_per_second"]
        return result

    # -- ranks ----------------------------------------------------------------------------------

    def _spec(self, mode: str, **extra: Any) -> Path:
        config = dsconfig.load(self.stage, self.s.ds_config)
        if not self.pin_memory:
            config = dsconfig.without_pinned_memory(config)
            print("pin_memory: off (ulimit -l is too low for pinned host memory)", flush=True)
        ds_path = dsconfig.write(config, self.paths.run / "ds_config.json")
        spec = {"settings": self.resolved(), "mode": mode, "stage": self.stage, "ds_config": str(ds_path),
                "batch_searched": self.batch_searched,
                "stop_file": str(self.paths.stop_file), "report_dir": str(self.paths.run / "reports"),
                "final_dir": str(self.paths.final), **extra}
        for old in (self.paths.run / "reports").glob(f"{mode}-rank*.json"):
            old.unlink()  # reports of an earlier start would be mistaken for this one's
        return report.write_json(self.paths.run / f"spec-{mode}.json", spec)

    def _rank_reports(self, mode: str) -> list[dict[str, Any]]:
        found = [report.read_json(p) for p in sorted((self.paths.run / "reports").glob(f"{mode}-rank*.json"))]
        return [r for r in found if r]

    def _launch(self, spec: Path) -> int:
        launch = Launch(self.s, self.ranks, spec, self.paths.stop_file, self.team.nodes)
        self.stopper.launch = launch
        try:
            self.team.announce(spec, self.paths.stop_file)  # the other nodes start their ranks on the same spec
            code = launch.run()
        finally:
            self.stopper.launch = None
        self.team.after_launch(code)
        return code

    # -- the end --------------------------------------------------------------------------------

    def _close(self, code: int, status: str) -> int:
        self.summary.update(stage=getattr(self, "stage", None), ranks=getattr(self, "ranks", None) and
                            self.ranks.world, status=status, exit_code=code)
        if hasattr(self, "checkpointing"):
            self.summary["resolved"] = self.resolved()
        train = self.summary.get("train") or {}
        points = report.losses(train.get("log_history") or [])
        if points:
            self.summary["final_loss"] = points[-1][1]
            report.plot_loss(points, self.paths.run / "loss.png", f"{self.s.model} (ZeRO {self.summary['stage']})")
        report.write_json(self.paths.summary, self.summary)
        if self.uploader is not None:
            code = self._finish_uploads(code)
        print(f"{status}: exit code {code}; summary in {self.paths.summary}", flush=True)
        return code

    def _finish_uploads(self, code: int) -> int:
        """Stopped or failed: flush the newest checkpoint in the grace left. Done: final model and reports."""
        if code != exitcodes.DONE:
            spent = time.monotonic() - (self.stopper.requested_at or time.monotonic())
            if not self.uploader.flush(max(self.s.stop_grace_seconds - spent, 0)):
                print(f"warning: the newest checkpoint did not reach the Hub: {self.uploader.behind()}", flush=True)
            self.uploader.stop(5)
            return code
        missing = self.uploader.finish(self.paths.final, self.paths.run, self.summary)
        self.summary["hub"] = self.uploader.uploaded()
        report.write_json(self.paths.summary, self.summary)
        if missing:
            print("error: trained, but not uploaded: " + "; ".join(missing), flush=True)
            return exitcodes.UPLOAD_INCOMPLETE
        return code


def split_text(micro_batch: int, grad_accum: int, checkpointing: bool) -> str:
    """A split of the rows per step as the log names it: "4 x 1, checkpointing off"."""
    return f"{micro_batch} x {grad_accum}, checkpointing {'on' if checkpointing else 'off'}"


def batch_candidates(rows: int, checkpointing: tuple[bool, ...], fits: Callable[[int, bool], bool],
                     every: bool) -> list[tuple[int, int, bool]]:
    """(micro-batch, accumulation, checkpointing) splits of `rows` per step worth timing, most rows per pass
    first, at most BATCH_SEARCH_TRIES. Each micro-batch comes with the first checkpointing choice that
    `fits` (the planner) allows, off before on: at the same micro-batch, recomputing only costs time.

    every=False (SFT_BATCH_SEARCH=auto): only the splits that can be the fastest. At the same
    checkpointing, more rows per pass measured faster every time (README, Speed: 4 x 1 > 2 x 2 > 1 x 4 on
    one H200), so of each checkpointing choice only its largest micro-batch is kept; what is left to
    time is a larger micro-batch with checkpointing against a smaller one without, which no memory
    rule decides (4 x 1 with it beat 2 x 2 without, README). every=True: each split that fits."""
    found: list[tuple[int, int, bool]] = []
    for mb in (m for m in range(rows, 0, -1) if rows % m == 0):
        choice = next((c for c in checkpointing if fits(mb, c)), None)
        if choice is None or (not every and any(f[2] == choice for f in found)):
            continue
        found.append((mb, rows // mb, choice))
    return found[:BATCH_SEARCH_TRIES]


def resolve(s: Settings, ranks: Ranks, checkpointing: bool, batch: tuple[int, int] | None = None) -> dict[str, Any]:
    """Settings as the ranks use them: attention, checkpointing and the batch split decided, never "auto"."""
    resolved = s.to_dict()
    resolved["gradient_checkpointing"] = checkpointing
    if batch is not None:
        resolved["micro_batch"], resolved["grad_accum"] = batch
    if s.attention == "auto":
        # flex_attention's block mask skips the other sequences of a packed row (measured on one H200:
        # 10,075 against 7,091 tokens/s with SDPA's dense mask, README); on CPU it has no fast kernel.
        resolved["attention"] = "flex_attention" if ranks.on_gpu else "sdpa"
    resolved["liger_kernels"] = liger_on(s, ranks)
    return resolved


def liger_on(s: Settings, ranks: Ranks) -> bool:
    """SFT_LIGER_KERNELS decided. Liger's kernels are Triton, GPU only. Measured on one H200, Qwen3-4B
    (README, Speed): 9 GiB less at 2 x 2 rows without checkpointing, at the same speed; at 4 x 1 rows
    with checkpointing 11,861 tokens/s with them, 8,784 without. The planner counts the memory they save."""
    return s.liger_kernels == "true" or (s.liger_kernels == "auto" and ranks.on_gpu and liger_available())


def _rank_memory_gib(ranks: Ranks) -> float:
    """Memory per rank: the GPU's, or on CPU ranks the host's shared among them."""
    import torch

    if ranks.on_gpu:
        return torch.cuda.get_device_properties(ranks.gpus[0]).total_memory / GIB
    return (_host_memory_gib() or 16.0) / ranks.count


def _host_memory_gib() -> float | None:
    from .preflight import host_memory_available

    available = host_memory_available()
    return available / GIB if available else None
