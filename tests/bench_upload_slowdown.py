"""How much a checkpoint upload slows training down: step times with and without one running (not a test).

    PYTHONPATH=. python tests/bench_upload_slowdown.py [GB per upload] [--uploads N] [--gap S] [--epochs E]

Runs the real job (entrypoint.py, two CPU ranks, the demo model, no Hub of its own) and, from this
process, as the job's controller does, uploads N checkpoints of GB gigabytes each to the local Hub server
(its own process) with sft/hub/uploader.py's Uploader, each after GAP seconds without one, while the ranks train.
Then compares the steps wholly inside the uploads with the steps wholly inside the GAP windows just before
them (neighbours in time: a machine shared with other work drifts), in tokens per second (the demo's
conversations differ in length, so seconds per step alone would mislead). --control replaces each upload
by a pause of that many seconds: the figure it prints is the method's noise.

The ranks time their steps with time.perf_counter() (CLOCK_MONOTONIC on Linux) into their report, the
same clock as time.monotonic() here, so upload windows and steps line up.

On CPU ranks this is a pessimistic, indicative figure: the ranks use every core, so the hashing and HTTP
of the upload, and the local server receiving it (which a real Hub does elsewhere), take cores from them.
On a GPU the ranks wait on the GPU and leave the host's cores mostly idle.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.update(HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="0",
                  HF_HUB_DISABLE_PROGRESS_BARS="1")  # before huggingface_hub is imported
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_upload_rate import SHARDS  # noqa: E402
from checkpoint_layout import make_checkpoint  # noqa: E402
from conftest import REPO, demo_env  # noqa: E402
from hub_fixtures import start_hub_process  # noqa: E402
from hubserver import WRITE_TOKEN  # noqa: E402

from sft.hub.preflight import preflight  # noqa: E402
from sft.hub.uploader import Uploader  # noqa: E402


def fill(path: Path, size: int, seed: bytes) -> None:
    """Incompressible, and different for every checkpoint: the server deduplicates LFS objects by content."""
    block = seed + os.urandom(64 * 2**20 - len(seed))
    with open(path, "wb") as f:
        for start in range(0, size, len(block)):
            f.write(block[: min(len(block), size - start)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gb", type=float, nargs="?", default=1.0)
    parser.add_argument("--uploads", type=int, default=6)
    parser.add_argument("--gap", type=float, default=5.0, help="seconds without an upload before each upload")
    parser.add_argument("--epochs", type=int, default=14, help="of 64 steps each; enough to outlast the uploads")
    parser.add_argument("--control", type=float, default=0.0,
                        help="no uploads: windows of this many seconds without one, to see the noise of the figure")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-slowdown-"))
    hub = start_hub_process(root / "hub")
    try:
        os.environ["HF_HOME"] = str(root / "hf-home")
        target = preflight("alice/bench", WRITE_TOKEN, endpoint=hub.url)
        uploaders = []
        for k in range(args.uploads):  # written before training starts, as the Trainer would have
            ckpt = make_checkpoint(root / f"up{k}", 100 * (k + 1))
            for rel in SHARDS:
                fill(ckpt / rel.replace("global_step100", ckpt.name.replace("checkpoint-", "global_step")),
                     int(args.gb * 1e9 / len(SHARDS)), f"{k}:{rel}".encode())
            uploaders.append(Uploader(target, root / f"up{k}", interval_s=3600, keep=100, log=lambda _: None))

        env = demo_env(root / "job", zero_stage="2", precision="fp32", seed=0, probe_steps=0, save_steps=100000,
                       logging_steps=1, epochs=args.epochs, packing="false")
        log = root / "job.log"
        with open(log, "w") as f:
            job = subprocess.Popen([sys.executable, str(REPO / "entrypoint.py")], env=env, cwd=REPO, stdout=f,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        while not re.search(r"\|\s*10/\d+ \[", log.read_text()):  # tqdm: the 10th step is done
            if job.poll() is not None:
                raise SystemExit(f"the job ended early:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        windows, idle, records = [], [], []
        for u in uploaders:
            started = time.monotonic()
            time.sleep(args.gap)
            idle.append((started, time.monotonic()))
            started = time.monotonic()
            if args.control:
                time.sleep(args.control)
            else:
                assert u.flush(600)
                records.append(u.uploaded()["uploads"][-1])
            windows.append((started, time.monotonic()))
            u.stop(5)
        if job.poll() is not None:
            print("warning: training ended before the last upload did: raise --epochs")
        job.wait(900)
        assert job.returncode == 0, log.read_text()[-3000:]

        steps = json.loads((root / "job" / "out" / "run" / "reports" / "train-rank0.json").read_text())["steps"]
        inside, outside = [], []
        for (_, t0, n0), (_, t1, n1) in zip(steps[5:], steps[6:]):
            if any(a <= t0 and t1 <= b for a, b in windows):
                inside.append((t1 - t0, n1 - n0))
            elif any(a <= t0 and t1 <= b for a, b in idle):
                outside.append((t1 - t0, n1 - n0))

        def rate(rows):
            return sum(n for _, n in rows) / sum(t for t, _ in rows)

        def median_step(rows):
            return statistics.median(t for t, _ in rows)

        if args.control:
            print(f"control: {len(windows)} windows of {args.control:g} s without an upload")
        else:
            print(f"uploads: {len(windows)} x {args.gb:g} GB, each {statistics.mean(b - a for a, b in windows):.1f} s "
                  f"with snapshot and sha256; commits at {', '.join(str(r['mb_per_s']) for r in records)} MB/s")
        print(f"steps without an upload: {len(outside)}, {rate(outside):.0f} tokens/s, median "
              f"{median_step(outside) * 1000:.0f} ms/step")
        print(f"steps during an upload:  {len(inside)}, {rate(inside):.0f} tokens/s, median "
              f"{median_step(inside) * 1000:.0f} ms/step")
        print(f"slowdown during {'a window' if args.control else 'an upload'}: {(rate(outside) / rate(inside) - 1) * 100:.1f}% in tokens/s, "
              f"{(median_step(inside) / median_step(outside) - 1) * 100:.1f}% in median step time")
    finally:
        hub.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
