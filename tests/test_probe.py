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
