"""The job's exit codes: each says what happened, so a scheduler can tell a retry from a fix. Each line's
comment is its meaning, as `entrypoint.py --help` shows it (meanings())."""

import re
from pathlib import Path

DONE = 0                # trained (or found already trained) and everything saved
FAILED = 1              # an unexpected error: read the log
BAD_SETTINGS = 2        # a setting, or what it names (model, DeepSpeed file, GPUs, HF_TOKEN), is wrong; nothing
                        # was started or written
PREFLIGHT = 3           # the machine cannot run this job (GPUs, disk, memory; or the disk would fill before the
                        # end: stopped at a complete checkpoint): fix it and start again
PROBE_OOM = 4           # the probe ran out of GPU memory: the message names the next stage to try
PROBE_FAILED = 5        # the probe failed for another reason
TRAIN_FAILED = 6        # training failed; complete checkpoints are kept and a new start resumes
UPLOAD_INCOMPLETE = 7   # trained, but something could not be uploaded: the message says what
HUB_AUTH = 8            # the Hub refused the token (unknown, expired, or no write access to the repo)
HUB_PUBLIC_REPO = 9     # SFT_HUB_REPO exists and is public: nothing is uploaded there (make it private or pick another)
HUB_UNREACHABLE = 10    # the Hub did not answer at start (network, outage): starting again later may work
OUTPUT_BUSY = 11        # another job is running on SFT_OUTPUT_DIR (it holds run/job.lock): nothing was done
OVER_BUDGET = 12        # the probe's projection exceeds SFT_MAX_HOURS / SFT_MAX_COST: nothing trained (see the log)
TIME_LIMIT = 75         # stopped for SFT_TIME_LIMIT or SLURM's end time, a checkpoint saved and uploaded: start again
STOPPED = 143           # stopped by SIGTERM/SIGINT after saving what it could (128 + SIGTERM)

# A rank's own exit codes (sft/ranks/train.py), read by the controller; the launcher passes the worst on.
RANK_OOM = 42           # the rank ran out of GPU memory (the probe then escalates)


def meanings() -> list[tuple[int, str, str]]:
    """(code, name, meaning) of every exit code, from this file's own lines (a comment may go on below)."""
    text = Path(__file__).read_text()
    found = re.findall(r"^([A-Z_]+) = (\d+) +# (.*(?:\n +# .*)*)", text, re.MULTILINE)
    return [(int(code), name, re.sub(r"\n +# ", " ", meaning).strip()) for name, code, meaning in found]
