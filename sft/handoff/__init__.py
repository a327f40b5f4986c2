"""What crosses a process or a restart, typed: each a dataclass with one JSON round trip (records.py).

    RunSpec           controller -> every rank: what to train and where (run/spec-MODE.json)
    RankReport        each rank -> controller: how it ended, its steps and memory (run/reports/)
    Verdict           controller -> every rank of a training launch that probes: go on, or end (run/verdict.json)
    Start             controller -> the processes started before its decision: the spec they run
                      (in a StandbyFolder: controller/standby.py)
    CheckpointRecord  rank 0 -> a later start: how a checkpoint was made (checkpoint-N/sft_job.json)
    Summary           controller -> the user, the Hub and a later start (run/summary.json)

Unknown keys in a file are ignored when it is read (a newer job's file stays readable by an older one),
and a missing key takes the field's default.
"""

from .records import Record, read_json, write_json
from .reports import RankReport, Summary
from .spec import CheckpointRecord, DataPlan, DataSource, RunSpec, Split
from .standby import StandbyFolder, Start, Verdict, lock_held

__all__ = ["CheckpointRecord", "DataPlan", "DataSource", "RankReport", "Record", "RunSpec", "Split", "StandbyFolder",
           "Start", "Summary", "Verdict", "lock_held", "read_json", "write_json"]
