#!/usr/bin/env python3
"""Seconds to build flex attention's block mask the job's way (sft/ranks/patches/: evaluated a band of
query rows at a time, nothing compiled) for one packed row of LENGTH tokens: documents of 900 tokens, causal.
The ranks build it once a step; this prints its cost alone, the third build of each length (the first two
warm the allocator), between torch.cuda.synchronize() calls.

    python scripts/bench_mask.py 16384 32768 65536 131072 262144
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sft.ranks.patches.masks import block_mask_by_rows  # noqa: E402


@click.command()
@click.argument("lengths", nargs=-1, type=int, required=True)
@click.option("--document", default=900, help="Tokens per packed document.")
def main(lengths: tuple[int, ...], document: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for length in lengths:
        doc = torch.arange(length, device=device) // document

        def mask_mod(b, h, q, kv):
            return (kv <= q) & (doc[q] == doc[kv])

        for _ in range(3):
            sync()
            start = time.perf_counter()
            mask = block_mask_by_rows(mask_mod, 1, 1, length, length, device)
            sync()
            seconds = time.perf_counter() - start
        click.echo(f"mask {length} ({device}): {seconds:.3f} s, kv blocks {int(mask.kv_num_blocks.sum())}, "
                   f"full {int(mask.full_kv_num_blocks.sum())}")


if __name__ == "__main__":
    main()
