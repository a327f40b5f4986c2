"""The probe's figures from rank reports: the steady state skips the first steps, and an allocator that
had to flush its cache (a sign the run sits at the card's limit) is shown."""

from sft.controller import figures as probe
from sft.handoff import RankReport
from sft.settings import Settings

GIB = 2**30


def report(rank: int, retries: int | None) -> RankReport:
    r = {"rank": rank, "world_size": 2, "peak_reserved_bytes": 100 * GIB, "device": "NVIDIA H200",
         "steps_per_epoch": 10, "global_step": 6,
         # (step, seconds, tokens): a slow first two steps, then 1 s and 1,000 tokens a step
         "steps": [[1, 0.0, 1000], [2, 10.0, 2000], [3, 11.0, 3000], [4, 12.0, 4000], [5, 13.0, 5000],
                   [6, 14.0, 6000]]}
    if retries is not None:
        r["alloc_retries"] = retries
    return RankReport.from_dict({"mode": "probe", **r})


SETTINGS = Settings(max_steps=-1, epochs=1.0)


def test_steady_state_and_projection():
    fig = probe.figures([report(1, None), report(0, None)], SETTINGS)
    assert fig["seconds_per_step"] == 1.0 and fig["tokens_per_second"] == 1000.0
    assert fig["peak_reserved_gib"] == [100.0, 100.0] and fig["total_steps"] == 10
    assert "alloc_retries" not in fig and "allocator" not in probe.table(fig)  # CPU ranks report none


def test_allocator_cache_flushes_are_reported_per_rank():
    quiet = probe.figures([report(0, 0), report(1, 0)], SETTINGS)
    assert quiet["alloc_retries"] == [0, 0] and "allocator" not in probe.table(quiet)
    busy = probe.figures([report(1, 7), report(0, 0)], SETTINGS)
    assert busy["alloc_retries"] == [0, 7]
    assert "allocator cache flushes per rank  0, 7" in probe.table(busy)


# Rank 0's (step, seconds, tokens) of a compiled Qwen3-1.7B probe on an H200 (2026-12-02, 30 steps): the first
# step compiles (19.3 s after train_began), then 0.26 s a step, except step 27, which recompiled the layers for a
# packed batch of 63 attention blocks instead of 64 (14.5 s).
H200_PROBE_STEPS = [
    [1, 396.527, 8179], [2, 412.597, 16324], [3, 412.865, 24509], [4, 413.123, 32683], [5, 413.386, 40848],
    [6, 413.644, 49038], [7, 413.902, 57227], [8, 414.161, 65412], [9, 414.416, 73600], [10, 414.671, 81790],
    [11, 414.932, 89979], [12, 415.196, 98104], [13, 415.456, 106219], [14, 415.717, 114390], [15, 415.971, 122555],
    [16, 416.226, 130716], [17, 416.479, 138906], [18, 416.741, 147095], [19, 416.998, 155286],
    [20, 417.256, 163465], [21, 417.511, 171541], [22, 417.772, 179727], [23, 418.035, 187915],
    [24, 418.3, 196051], [25, 418.559, 204135], [26, 418.826, 212237], [27, 433.278, 220295],
    [28, 433.539, 228480], [29, 433.804, 236550], [30, 434.065, 244734]]


def test_a_recompiling_step_is_a_stall_not_the_steady_rate():
    """Over steps 4-30 the mean was 0.806 s a step and 10,126 tokens/s, what the probe reported, a third of the
    rate every step but one ran at. The recompilation's 14.2 s beyond a step is a one-off: with the warm-up,
    once, in the projection."""
    steps = H200_PROBE_STEPS
    rates = probe.steady_rates(steps)
    assert rates["seconds_per_step"] == 0.2596 and 31_300 < rates["tokens_per_second"] < 31_500
    assert rates["stall_seconds"] == 14.2
    main = RankReport.from_dict({"mode": "probe", "rank": 0, "world_size": 1, "peak_reserved_bytes": 50 * GIB,
                                 "device": "NVIDIA H200", "steps_per_epoch": 524, "global_step": 30,
                                 "steps": steps, "train_began": 377.222})
    fig = probe.figures([main], SETTINGS)
    first = steps[3][1] - 377.222 - 4 * 0.2596  # steps 1-4 beyond the steady rate: the first compile
    assert fig["warmup_seconds"] == round(first + 14.2, 1)
    assert fig["train_hours"] == round(524 * 0.2596 / 3600, 3)
    row = next(line for line in probe.table(fig).splitlines() if "of which later stalls" in line)
    assert row.split("stalls", 1)[1].strip().startswith("14.2 (steps 3x the steady one or more: a recompilation)")
    # without the stall, nothing is set apart
    smooth = probe.steady_rates(steps[:26])
    assert "stall_seconds" not in smooth and abs(smooth["seconds_per_step"] - rates["seconds_per_step"]) < 0.001


def test_the_start_is_split_at_the_ranks_training_loop():
    """From the job's start: 27.0 s to the ranks' training loop, the first step ending 30.9 s later (the H200's
    default row of 2026-12-04 had about these: its compilation is the first step's)."""
    main = RankReport.from_dict({"mode": "probe", "rank": 0, "world_size": 1, "peak_reserved_bytes": 95 * GIB,
                                 "device": "NVIDIA H200", "steps_per_epoch": 262, "global_step": 14,
                                 "steps": [[i, 130.9 + 0.41 * (i - 1), 8192 * i] for i in range(1, 15)],
                                 "train_began": 100.0, "train_began_wall": 1000.0 + 27.0,
                                 "first_step_wall": 1000.0 + 57.9})
    fig = probe.figures([main], SETTINGS, started_at=1000.0)
    assert (fig["seconds_to_training_loop"], fig["seconds_to_first_step"]) == (27.0, 57.9)
    table = probe.table(fig).splitlines()
    at = next(i for i, line in enumerate(table) if line.strip().startswith("seconds from start to first step"))
    assert table[at + 1].split("loop", 1)[1].strip().startswith("27.0 (the decision, the ranks' imports")
    assert "training loop" not in probe.table(probe.figures([main], SETTINGS))  # no start given: no split


def one_epoch(save_steps: int | None, save_seconds: float, **settings) -> dict:
    """Figures of a probe like an H200's on Qwen3-4B (2026-12-03): 0.4705 s a step, 2,073 steps an epoch."""
    from sft.planner.budget import Overheads

    steps = [[i, 100 + 0.4705 * i, 8192 * i] for i in range(1, 51)]
    main = RankReport.from_dict({"mode": "probe", "rank": 0, "world_size": 1, "peak_reserved_bytes": 108 * GIB,
                                 "device": "NVIDIA H200", "steps_per_epoch": 2073, "global_step": 50,
                                 "steps": steps, "train_began": 100.0})
    return probe.figures([main], Settings(max_steps=-1, epochs=1.0, save_steps=save_steps, **settings),
                         Overheads(save_seconds=save_seconds, final_seconds=16.1))


def checkpoints_row(fig: dict) -> str:
    return next(line for line in probe.table(fig).splitlines() if "of which checkpoints" in line)


def test_the_checkpoints_share_of_the_run_is_shown_and_a_large_one_says_what_save_steps_would_do():
    """The README's recipe saves every 200 steps; a Qwen3-4B checkpoint (64.4 GB at the assumed 500 MB/s: 128.8 s)
    is as long as 274 of its steps: 11 saves (every 200 steps and the Trainer's at the last) are most of the run."""
    fig = one_epoch(200, 128.8)
    assert fig["saves"] == 11 and fig["save_hours"] == round(11 * 128.8 / 3600, 3)
    row = checkpoints_row(fig)
    assert "11 x about 129 s, estimated: 59% of the run; each as long as 274 steps" in row
    assert row.endswith("fewer checkpoints (SFT_SAVE_STEPS) trade this time for what a lost machine can cost")
    # cheaper checkpoints, written often: how often would cost about 10% of the steps' time
    row = checkpoints_row(one_epoch(50, 20.0))
    assert "42 x about 20 s" in row  # 41 every 50 steps, and the last
    assert row.endswith("SFT_SAVE_STEPS=426 would make them about 10% of the steps' time, a checkpoint every 3 min "
                        "(what a lost machine can cost)")
    row = checkpoints_row(one_epoch(1000, 20.0))  # 3 saves: 6% of the run, nothing to say
    assert row.split("of which checkpoints", 1)[1].strip() == "0.017 (3 x about 20 s, estimated: 6% of the run; " \
                                                               "each as long as 43 steps)"


def test_checkpoints_by_time_are_counted_from_the_probes_speed():
    """The default cadence: a checkpoint each SFT_UPLOAD_MINUTES (30) of training. At 0.4705 s a step that is 3,826
    steps, more than the epoch's 2,073: none, the end writing the model alone. Every minute: 128 steps apart, 16."""
    assert one_epoch(None, 128.8)["saves"] == 0
    fig = one_epoch(None, 30.0, save_minutes=1.0)
    assert (fig["saves"], fig["save_minutes"]) == (16, 1.0)
    assert fig["save_hours"] == round(16 * 30.0 / 3600, 3)
    # 30 s each, 638 steps' worth at 10%: the hint speaks of the setting the run uses
    assert checkpoints_row(fig).endswith("SFT_SAVE_MINUTES=6 would make them about 10% of the steps' time, a "
                                         "checkpoint every 6 min (what a lost machine can cost)")
    assert one_epoch(None, 30.0, upload_minutes=1.0)["saves"] == 16  # the upload's interval is the default's
