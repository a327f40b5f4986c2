"""DeepSpeed's ZeRO-2 gradient norm against the job's (sft/ranks/patches/zero_step.py::gradient_norm_in_fp32) on the
same training: real DeepSpeed in bf16 on CPU ranks (gloo), clipping on, three steps with DeepSpeed's own norm, then the
same three steps from the same weights with the job's; then with each, one step whose gradient holds a NaN. Parameters
of odd sizes, so with two ranks a parameter is split between them and the partitions are padded. Rank 0 prints one JSON
line. Usage: python -m tests.gradient_norm_step PORT RANK WORLD_SIZE, from the repository root (run by
tests/test_patches.py)."""

import json
import os
import sys

port, rank, world = sys.argv[1:4]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank)

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from sft.ranks.patches import zero_step  # noqa: E402
from sft.stages import shipped_config  # noqa: E402

config = shipped_config("2")
config.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1, train_batch_size=2 * int(world),
              gradient_clipping=0.5)
config["bf16"]["enabled"] = True
deepspeed.init_distributed(dist_backend="gloo")


def fresh_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(53, 27), nn.Linear(27, 41), nn.GELU(), nn.LayerNorm(41), nn.Linear(41, 53))


def train(steps: int, nan_at: int | None = None) -> list[float]:
    """Each step's gradient norm as the ranks read it (the engine's, before clipping)."""
    model = fresh_model()
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                      config=config)
    generator = torch.Generator().manual_seed(1 + int(rank))
    norms = []
    for step in range(steps):
        tokens = torch.randint(0, 53, (2, 7), generator=generator)
        hook = (engine.module[4].weight.register_hook(lambda g: torch.full_like(g, float("nan")))
                if step == nan_at else None)
        loss = nn.functional.cross_entropy(engine(tokens).float().flatten(0, 1), tokens.roll(1, 1).flatten())
        engine.backward(loss * 40)  # gradients far above the clipping's 0.5, so every step is clipped
        engine.step()
        if hook:
            hook.remove()
        norms.append(float(engine.get_global_grad_norm()))
    return norms


deepspeeds, deepspeeds_nan = train(3), train(1, nan_at=0)
zero_step.gradient_norm_in_fp32()
zero_step.gradient_norm_in_fp32()  # installed twice: wraps once
jobs, jobs_nan = train(3), train(1, nan_at=0)
if rank == "0":
    print(json.dumps({"deepspeed": deepspeeds, "job": jobs, "deepspeed_nan": deepspeeds_nan, "job_nan": jobs_nan}))

# Leave as the ranks leave (sft/ranks/train.py): at the interpreter's teardown a library thread still running now
# and then aborts the process ("terminate called without an active exception") after its result is printed.
sys.stdout.flush()
os._exit(0)
