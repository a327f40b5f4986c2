"""Upload and download rate of sft/hub/ (uploader, resume) against the local Hub server (not a test).

    HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HOME=/tmp/bench-hf PYTHONPATH=. \
        python tests/bench_upload_rate.py [GB] [--process]

One checkpoint in the Trainer + DeepSpeed layout whose three shards together hold GB gigabytes (10**9);
--process runs the server as its own process (as a container test would), else in this one.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoint_layout import make_checkpoint  # noqa: E402
from hub_fixtures import start_hub_process  # noqa: E402
from hubserver import WRITE_TOKEN, HubServer  # noqa: E402

from sft.hub import resume as hub_resume  # noqa: E402
from sft.hub.preflight import preflight  # noqa: E402
from sft.hub.uploader import Uploader  # noqa: E402

SHARDS = ("global_step100/zero_pp_rank_0_mp_rank_00_optim_states.pt",
          "global_step100/zero_pp_rank_1_mp_rank_00_optim_states.pt", "global_step100/mp_rank_00_model_states.pt")


def fill(path: Path, size: int) -> None:
    block = os.urandom(64 * 2**20)  # incompressible, and LFS objects are deduplicated by content: one pass
    with open(path, "wb") as f:
        for start in range(0, size, len(block)):
            f.write(block[: min(len(block), size - start)])


def main(gb: float, process: bool) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-upload-"))
    server = start_hub_process(root / "hub") if process else HubServer(root / "hub").start()
    try:
        ckpt = make_checkpoint(root / "out", 100)
        for rel in SHARDS:
            fill(ckpt / rel, int(gb * 1e9 / len(SHARDS)))
        target = preflight("alice/bench", WRITE_TOKEN, endpoint=server.url)
        uploader = Uploader(target, root / "out", interval_s=3600, keep=2, log=lambda line: None)
        started = time.monotonic()
        assert uploader.flush(3600)
        wall = time.monotonic() - started
        record = uploader.uploaded()["uploads"][0]
        uploader.stop(5)
        print(f"upload: {record['bytes'] / 1e9:.2f} GB, commits {record['seconds']:.1f} s = {record['mb_per_s']:.0f} "
              f"MB/s; with snapshot and sha256 {wall:.1f} s = {record['bytes'] / 1e6 / wall:.0f} MB/s")
        started = time.monotonic()
        hub_resume.download_checkpoint(target.api, "alice/bench", 100, root / "fresh")
        wall = time.monotonic() - started
        print(f"download + verify: {wall:.1f} s = {record['bytes'] / 1e6 / wall:.0f} MB/s")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(float(args[0]) if args else 2.0, "--process" in sys.argv)
