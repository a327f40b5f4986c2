"""What tests/test_fuzz.py generates: values for every SFT_ setting, data files, chat templates and Hub names, each
drawn from a seeded random.Random (the standard library's; no shrinking, but every failure prints its seed and its
case, and a case that failed once is kept in test_fuzz.py's regressions).

Values are drawn per field from what the field is (its type, bounds and choices in sft/settings/fields.py) and from
what users and accidents give: edges of the bounds, huge and tiny numbers, inf and nan, empty, very long, odd
characters, paths that are not there or are the system's."""

from __future__ import annotations

import codecs
import dataclasses
import json
import random
import string
from pathlib import Path

from conftest import DEMO_MODEL
from sft.settings import Settings, env_name

NUMBERS = ["0", "-1", "1", "2", "3", "8", "-0", "+3", "1e309", "-1e309", "inf", "-inf", "nan", "NaN", "1e-320",
           "4.9e-324", "0.5", "0.999999", "1.0000001", "2147483647", "2147483648", "4294967296", "9" * 30, "1" * 400,
           "0x10", "1_000", "１２", "1e3", "1,5", "1.5.2", " 7 ", "7\t", "", " ", "--1", "1e", ".", "-.5"]
WORDS = ["auto", "true", "false", "yes", "no", "on", "off", "1", "0", "TRUE", "Auto", "none", "None", "null", "offload",
         "drop", "error", "truncate", "refuse", "all", "assistant", "completion", "sdpa", "eager", "flex_attention",
         "flash_attention_4", "torchrun", "deepspeed", "bf16", "fp32", "fp16", "3-offload", "3-offload-all", "4"]
ODD = ["", " ", "\t", "é", "ß", "日本語", "🙂", "a\nb", "a\rb", "'", '"', "\\", "$HOME", "`id`", "%s", "{}", "[]", "{",
       "a" * 300, "b" * 5000, "../../..", "/", "~", "-", "--help", ",", ",,", ":", "x:0", "x:1.5", "\u202e", "\ufeff"]
PATHS = ["/", "/etc", "/etc/passwd", "/dev/null", "/proc/self", "/tmp", "/usr/lib", "/root", "~", ".", "..",
         "does/not/exist", "./nope", "/nope/nope", str(DEMO_MODEL), str(DEMO_MODEL / "config.json"),
         str(DEMO_MODEL / "chat_template.jinja"), "demo", "demo/chat.jsonl"]
NAMES = ["Qwen/Qwen3-8B", "gpt2", "a/b", "a--b/c", "a/b.git", "-a/b", "a/-b", "a/.b", "a./b", "a/b/c", "café/x",
         "a b/c", "owner/" + "n" * 96, "owner/" + "n" * 97, "o" * 97 + "/n", "/a", "a/", "_/_", ".a/b", "a..b/c",
         "trl-lib/Capybara", "you/qwen3-8b-sft"]
TEMPLATE_BITS = ["{{", "}}", "{%", "%}", "{% endfor %}", "{% if %}", "{{ m.content.__class__ }}",
                 "{{ raise_exception('no') }}", "{{ undefined_name.x }}", "{{ messages[99].content }}",
                 "{% generation %}", "{% endgeneration %}", "{{ m['content'] | upper }}", "{{ 1/0 }}",
                 "{% for x in range(10**9) %}", "{# #}", "\x00", "{{ m.role }}", "{% set x = 1 %}"]


def setting_value(rng: random.Random, f: dataclasses.Field) -> str:
    """One value for the field: mostly of its own kind, sometimes of any kind."""
    kind, meta = str(f.type), f.metadata
    pools = [NUMBERS, WORDS, ODD, PATHS, NAMES]
    if rng.random() < 0.7:
        if meta.get("choices"):
            pools = [list(meta["choices"]) + WORDS]
        elif "bool" in kind:
            pools = [WORDS]
        elif "int" in kind or "float" in kind:
            pools = [NUMBERS + _bounds(meta)]
        elif f.name in ("model", "chat_template", "ds_config", "output_dir", "dataset", "eval_dataset"):
            pools = [PATHS + NAMES]
        elif f.name in ("hub_repo",):
            pools = [NAMES]
    value = rng.choice(rng.choice(pools))
    return value if rng.random() < 0.9 else value + rng.choice(ODD)


def _bounds(meta) -> list[str]:
    found = []
    for key in ("min", "gt", "lt", "max"):
        if key in meta:
            found += [str(meta[key]), str(meta[key] - 1), str(meta[key] + 1)]
    return found


def settings_case(rng: random.Random, tmp: Path) -> dict[str, str]:
    """An environment: the demo's model, data and a fresh output folder, then 1-4 settings drawn, now and then an
    SFT_ name that is no setting."""
    fields = [f for f in dataclasses.fields(Settings)]
    env = {"SFT_MODEL": str(DEMO_MODEL), "SFT_DATASET": "demo/chat.jsonl", "SFT_OUTPUT_DIR": str(tmp / "out")}
    for f in rng.sample(fields, rng.randint(1, 4)):
        env[env_name(f.name)] = setting_value(rng, f)
    if rng.random() < 0.1:
        env["SFT_" + rng.choice(["MODE", "MICROBATCH", "EPOCH", "LR", "X" * 40])] = rng.choice(NUMBERS)
    return env


# --- data files

def _message(rng: random.Random, role: str, key: str = "role", value: str = "content") -> dict:
    kinds = [lambda: _text(rng), lambda: "", lambda: None, lambda: 7, lambda: [{"type": "text", "text": _text(rng)}],
             lambda: {"nested": 1}]
    message = {key: role, value: kinds[0]() if rng.random() < 0.8 else rng.choice(kinds)()}
    if rng.random() < 0.05:
        message.pop(rng.choice([key, value]))
    if rng.random() < 0.05:
        message["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    return message


def _text(rng: random.Random) -> str:
    pieces = ["hello", "café", "日本", "🙂", " ", "\n", "\t", "\\", '"', "\u202e", "\ufeff", "a" * rng.choice([1, 50, 3000])]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))


def _conversation(rng: random.Random, sharegpt: bool = False) -> list[dict]:
    roles = (["human", "gpt", "system", "user", "assistant", "bing"] if sharegpt else
             ["user", "assistant", "system", "tool", "human", "gpt", "", "USER"])
    common = roles[:2]
    turns = [rng.choice(common if rng.random() < 0.9 else roles) for _ in range(rng.randint(0, 5))]
    key, value = ("from", "value") if sharegpt else ("role", "content")
    return [_message(rng, r, key, value) for r in turns]


def row(rng: random.Random, shape: str):
    """One row of a shape, sometimes broken: a missing or null field, another type, an empty one."""
    made = {
        "messages": lambda: {"messages": _conversation(rng)},
        "sharegpt": lambda: {"conversations": _conversation(rng, sharegpt=True)},
        "text": lambda: {"text": _text(rng)},
        "standard_pc": lambda: {"prompt": _text(rng), "completion": _text(rng)},
        "conversational_pc": lambda: {"prompt": _conversation(rng)[:2], "completion": _conversation(rng)[-1:]},
    }[shape]()
    r = rng.random()
    if r < 0.04:
        made = {k: None for k in made}
    elif r < 0.07:
        made = {}
    elif r < 0.09:
        made = {k: rng.choice([1, 2.5, True, [], {}, "x"]) for k in made}
    elif r < 0.10:
        return rng.choice([[1, 2], "string", 3, None])  # not an object
    if rng.random() < 0.05:
        made["extra"] = rng.choice([1, "x", None, [1]])
    return made


ENCODINGS = ["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32", "cp1252", "latin-1"]
ENDINGS = ["\n", "\n", "\r\n", "\r"]
SUFFIXES = [".jsonl", ".jsonl", ".json", ".csv", ".parquet"]
FILE_NAMES = ["data", "my data", "données", "データ", "-dash", "a" * 200, "x:1", "a,b", "dot.dot", " lead"]


def data_case(rng: random.Random, folder: Path) -> tuple[Path, str]:
    """A data file of a drawn shape, format, encoding, line ending and name; (its path, what it is, for the report)."""
    shape = rng.choice(["messages", "messages", "sharegpt", "text", "standard_pc", "conversational_pc"])
    rows = [row(rng, shape) for _ in range(rng.choice([0, 1, 3, 20, 60]))]
    suffix, encoding, ending = rng.choice(SUFFIXES), rng.choice(ENCODINGS), rng.choice(ENDINGS)
    path = folder / (rng.choice(FILE_NAMES) + suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        encoding, ending = "parquet", ""
        _parquet(path, [r for r in rows if isinstance(r, dict)])
    else:
        text = _serialise(rows, suffix, ending)
        if rng.random() < 0.05:  # cut short, as a copy that was interrupted
            text = text[: rng.randint(0, len(text))]
        data = text.encode(encoding.replace("-sig", ""), errors="replace")
        if encoding == "utf-8-sig":
            data = codecs.BOM_UTF8 + data
        path.write_bytes(data)
    return path, f"{shape}, {len(rows)} rows, {suffix}, {encoding}, line ending {ending!r}"


def _serialise(rows: list, suffix: str, ending: str) -> str:
    if suffix == ".json":
        return json.dumps(rows, ensure_ascii=False, indent=1).replace("\n", ending)
    if suffix == ".csv":
        import csv
        import io

        out = io.StringIO()
        keys = sorted({k for r in rows if isinstance(r, dict) for k in r}) or ["text"]
        writer = csv.DictWriter(out, keys, lineterminator=ending, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            if isinstance(r, dict):
                writer.writerow({k: v if isinstance(v, str) or v is None else json.dumps(v) for k, v in r.items()})
        return out.getvalue()
    return "".join(json.dumps(r, ensure_ascii=False) + ending for r in rows)


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist(rows) if rows else pa.table({"text": pa.array([], pa.string())})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        table = pa.table({"text": [json.dumps(r) for r in rows]})  # rows pyarrow cannot type: as text
    pq.write_table(table, path)


# --- templates, names

def template(rng: random.Random, base: str) -> str:
    """The model's own template with a few bits cut out or put in."""
    text = base
    for _ in range(rng.randint(1, 3)):
        at = rng.randint(0, len(text))
        if rng.random() < 0.5:
            text = text[:at] + text[at + rng.randint(1, 4):]
        else:
            text = text[:at] + rng.choice(TEMPLATE_BITS) + text[at:]
    return text


def hub_name(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(NAMES)
    alphabet = string.ascii_letters + string.digits + "-_./ é"
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 3, 10, 40, 100])))
