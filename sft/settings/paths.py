"""Where the job may write: SFT_OUTPUT_DIR checked before anything is written (nothing here writes).

A folder the job writes into is its own: checkpoints rotate in it, a resume reads it, run/events.jsonl grows there.
So it may not be the filesystem's root or a system folder, nor share a folder with what the job reads: not a data
folder, the model's folder or a folder inside one (the next load would read what the run wrote, and the final
model would overwrite the model it trains), nor hold them (a dataset or model inside the output folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from .entries import Entry, parse
from .problems import bad

from .system import SHARED, SYSTEM, resolved
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits, in bytes (a longer name fails at the first mkdir)


def output_problems(s) -> list[str]:
    """SFT_OUTPUT_DIR's problems: a path Linux can hold, a folder (or none yet) whose nearest existing parent is
    writable, not a system folder, apart from every input the settings name."""
    value = s.output_dir
    if (why := _unusable(value)) is not None:
        return [bad("SFT_OUTPUT_DIR", value, why)]
    path = Path(os.path.expanduser(value)).absolute()
    if os.path.exists(path) and not os.path.isdir(path):
        return [bad("SFT_OUTPUT_DIR", value, "exists and is not a folder")]
    real = Path(os.path.realpath(path))
    if (why := _system(real)) is not None:
        return [bad("SFT_OUTPUT_DIR", value, why)]
    existing = path
    while not os.path.exists(existing):
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        return [bad("SFT_OUTPUT_DIR", value, f"{existing} is not writable (mount a writable folder there)")]
    return [bad("SFT_OUTPUT_DIR", value, why) for why in _overlaps({path, real}, s)]


def _unusable(value: str) -> str | None:
    encoded = os.fsencode(os.path.expanduser(value))
    if len(encoded) >= PATH_MAX:
        return f"a path of {len(encoded)} bytes: Linux takes at most {PATH_MAX - 1}"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"a folder name of {len(longest)} bytes: Linux takes at most {NAME_MAX}"
    return None


def _system(real: Path) -> str | None:
    if str(real) in SHARED:
        return (f"{real} is {'the filesystem root' if str(real) == '/' else 'a system folder'}: the job writes "
                "checkpoints, final/ and run/ there; give a folder of its own, such as /data/output")
    if any(real == Path(s) or Path(s) in real.parents for s in resolved(SYSTEM)):
        return f"{real} is in the system's folders: give a folder of its own, such as /data/output"
    return None


def _overlaps(outs: set[Path], s) -> list[str]:
    """Each input the settings name that the output folder is, is inside, or holds: as written and with links
    resolved, either way (a link in the output folder to the model would have final/ written into the model)."""
    found = []
    for var, path in _inputs(s):
        given = Path(os.path.expanduser(path)).absolute()
        ways = [(out, p) for out in outs for p in {given, Path(os.path.realpath(given))}]
        folder = os.path.isdir(given)
        if folder and any(out == p or p in out.parents for out, p in ways):
            what = "is" if any(out == p for out, p in ways) else "is inside"
            found.append(f"{what} {var}'s folder {path}: the job would write among what it reads; give a folder "
                         "of its own")
        elif any(out in p.parents for out, p in ways):
            found.append(f"holds {var}'s {'folder' if folder else 'file'} {path}: the job rotates and rewrites what "
                         "is in its output folder; keep the inputs outside it, or give another SFT_OUTPUT_DIR")
    return found


def _inputs(s) -> list[tuple[str, str]]:
    """The local inputs the settings name, as (variable, path), those that exist."""
    named = [("SFT_MODEL", s.model), ("SFT_CHAT_TEMPLATE", s.chat_template), ("SFT_DS_CONFIG", s.ds_config)]
    for var, value in (("SFT_DATASET", s.dataset), ("SFT_EVAL_DATASET", s.eval_dataset)):
        try:
            named += [(var, e.path) for e in parse(value or "")] if value else []
        except ValueError:
            continue  # the entry's own problem is named already
    return [(var, p) for var, p in named if p and Entry(p).local and os.path.exists(os.path.expanduser(p))]
