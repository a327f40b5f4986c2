"""The job's settings, at the bottom of the tree: one frozen dataclass read from SFT_* variables by one function,
every problem reported at once. It imports nothing of the job's above it.

    fields.py    Settings: a field per variable, with its help (--help and docs/settings.md show it)
    parse.py     from_env: read and parse every variable, then check them; describe and markdown_table
    checks.py    what involves more than one variable's syntax: files, formats, combinations
    entries.py   what SFT_DATASET and SFT_EVAL_DATASET say: sources and their amounts (sft/data/ loads them)
    times.py     SFT_TIME_LIMIT and SLURM's end time, as epoch seconds
    names.py     what the Hub takes as a repo's name (huggingface_hub's validator)
    problems.py  how a problem reads (VAR='value': what would be valid), and the list of them before exit 2
"""

from .fields import ECOSYSTEM_VARS, Settings
from .names import hub_name_problem, is_hub_name
from .parse import describe, env_name, from_env, markdown_table
from .problems import SettingsError, bad, refusal

__all__ = ["ECOSYSTEM_VARS", "Settings", "SettingsError", "bad", "describe", "env_name", "from_env", "hub_name_problem",
           "is_hub_name", "markdown_table", "refusal"]
