"""Small datasets of every shape TRL trains on, made from the demo's conversations, written in every format
the job reads (JSON Lines, JSON, Parquet, CSV, a folder of splits, datasets' save_to_disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import DEMO_DATA, DEMO_MODEL

SYSTEM = {"role": "system", "content": "Answer briefly."}


def conversations(n: int = 512) -> list[list[dict]]:
    """The demo's conversations, repeated to n; every third opens with a system turn."""
    lines = DEMO_DATA.read_text().splitlines()
    # parsed anew for each row: no two rows share a message a test may change
    return [([dict(SYSTEM)] if i % 3 == 0 else []) + json.loads(lines[i % len(lines)])["messages"] for i in range(n)]


def rows(shape: str, n: int = 512) -> list[dict]:
    """n rows of one shape: messages, conversational_pc, standard_pc, text, or alpaca (Alpaca's columns, read as
    conversational_pc)."""
    out = []
    for chat in conversations(n):
        if shape == "alpaca":
            question, answer = chat[-2]["content"], chat[-1]["content"]
            out.append({"instruction": "Answer the question.", "input": question, "output": answer})
        elif shape == "messages":
            out.append({"messages": chat})
        elif shape == "conversational_pc":
            out.append({"prompt": chat[:-1], "completion": chat[-1:]})
        else:
            question, answer = chat[-2]["content"], chat[-1]["content"]
            if shape == "standard_pc":
                out.append({"prompt": f"Question: {question}\nAnswer:", "completion": f" {answer}"})
            else:
                out.append({"text": f"Question: {question}\nAnswer: {answer}"})
    return out


def write(path: Path, data: list[dict]) -> Path:
    """data in the format the suffix says (.jsonl, .json, .parquet, .csv)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    elif path.suffix == ".json":
        path.write_text(json.dumps(data, indent=1))
    else:
        from datasets import Dataset

        ds = Dataset.from_list(data)
        ds.to_parquet(str(path)) if path.suffix == ".parquet" else ds.to_csv(str(path), index=False)
    return path


def save_to_disk(path: Path, splits: dict[str, list[dict]]) -> Path:
    """A folder as datasets' save_to_disk writes it: a DatasetDict of these splits."""
    from datasets import Dataset, DatasetDict

    DatasetDict({name: Dataset.from_list(data) for name, data in splits.items()}).save_to_disk(str(path))
    return path


def cache_hub_dataset(hf_home: Path, repo_id: str, data: list[dict]) -> str:
    """`repo_id` in the Hugging Face cache under hf_home, as a machine that had loaded it once holds it:
    served once by the local Hub server and loaded by datasets in a process of its own (datasets reads its
    cache folder at import). Returns the commit."""
    import os
    import subprocess
    import sys

    from hub_fixtures import TESTS, client_env
    from hubserver import HubServer

    token = "hf_FAKE-cache-fixture-token"
    server = HubServer(hf_home.parent / f"hub-for-{repo_id.replace('/', '-')}").start()
    server.add_token(token, repo_id.split("/")[0])
    load = (
        "import json, sys, datasets\n"
        "from huggingface_hub import HfApi\n"
        "api = HfApi()\n"
        f"api.create_repo({repo_id!r}, repo_type='dataset')\n"
        "rows = json.loads(sys.stdin.read())\n"
        "data = ''.join(json.dumps(r) + '\\n' for r in rows).encode()\n"
        f"commit = api.upload_file(path_or_fileobj=data, path_in_repo='data/train.jsonl', repo_id={repo_id!r},"
        " repo_type='dataset').oid\n"
        f"datasets.load_dataset({repo_id!r}, split='train', revision=commit)\n"
        f"datasets.load_dataset({repo_id!r}, split='train')\n"
        "print(commit)\n")
    env = {**os.environ, **client_env(server.url, hf_home), "HF_TOKEN": token, "PYTHONPATH": str(TESTS)}
    try:
        done = subprocess.run([sys.executable, "-c", load], input=json.dumps(data), env=env, capture_output=True,
                              text=True, timeout=300, check=True)
    finally:
        server.stop()
    return done.stdout.strip().splitlines()[-1]


def read(tmp_path: Path, max_length: int = 128, **settings):
    """The data step as the job runs it (controller/data.py), on the demo model, one micro-batch row, two ranks."""
    from sft.controller import data as data_step
    from sft.planner.inputs import Ranks
    from sft.settings import Settings

    small = {"max_length": max_length, "micro_batch": 1, **settings}
    return data_step.read(Settings(model=str(DEMO_MODEL), output_dir=str(tmp_path / "out"), **small), Ranks(2, ()))


def problems(tmp_path: Path, max_length: int = 128, **settings) -> list[str]:
    """The data step's refusal: its problems, every one."""
    from sft.data import DataError

    with pytest.raises(DataError) as e:
        read(tmp_path, max_length, **settings)
    return e.value.problems
