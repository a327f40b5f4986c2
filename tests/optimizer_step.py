"""DeepSpeed's ZeRO-1 or 2 step against the job's (sft/ranks/patches/zero_step.py::zero_step_in_one_pass) on the same
training: real DeepSpeed in bf16 on CPU ranks (gloo), torch's AdamW with two parameter groups (weight decay and none, as
the Trainer makes them) and a learning rate that changes each step, clipping on; four steps with DeepSpeed's own step,
then the same four from the same weights with the job's. FUSED "bnb8": bitsandbytes' 8-bit AdamW instead (the 8-bit
options' optimizer, sft/ranks/patches/adamw8bit.py), its state read as bitsandbytes keeps it. Then the job's engine saves a checkpoint, a fresh engine with
DeepSpeed's own step loads it, and both take one more step. Parameters of odd sizes, so with two ranks a parameter is
split between them and the partitions are padded. Rank 0 prints one JSON line. Usage: python -m tests.optimizer_step
PORT RANK WORLD_SIZE FUSED CHECKPOINT_DIR STAGE, from the repository root (run by tests/test_patches.py)."""

import json
import os
import sys

port, rank, world, fused, folder, stage = sys.argv[1:7]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank)

import deepspeed  # noqa: E402
import torch  # noqa: E402
from deepspeed.runtime.zero import stage_1_and_2 as zero  # noqa: E402
from torch import nn  # noqa: E402

from sft.ranks.patches import adamw, adamw8bit, zero_step  # noqa: E402
from sft.stages import shipped_config  # noqa: E402

config = shipped_config(stage)
config.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1, train_batch_size=2 * int(world),
              gradient_clipping=0.5)
config["bf16"]["enabled"] = True
config["zero_allow_untested_optimizer"] = True  # as the Trainer sets it for an optimizer of its own making
deepspeed.init_distributed(dist_backend="gloo")
deepspeeds_step = zero.DeepSpeedZeroOptimizer.step
# the state compared: torch's moments, or bitsandbytes' (8-bit moments and their blocks' absmax; a partition under
# its min_8bit_size keeps 32-bit moments, with no absmax)
STATE = ("state1", "state2") if fused == "bnb8" else ("exp_avg", "exp_avg_sq")


def engine_of(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(53, 27), nn.Linear(27, 41), nn.GELU(), nn.LayerNorm(41), nn.Linear(41, 53))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    if fused == "bnb8":
        import bitsandbytes

        optimizer = bitsandbytes.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, optim_bits=8)
    else:
        optimizer = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, fused=fused == "fused")
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=schedule, config=config)
    return engine


def train(engine, steps: int, seed: int) -> list[dict]:
    """After each step: the norm, and every rank's partitions of the master weights and Adam's moments, and the
    module's bf16 weights, as lists."""
    generator = torch.Generator().manual_seed(seed + int(rank))
    seen = []
    for _ in range(steps):
        tokens = torch.randint(0, 53, (2, 7), generator=generator)
        loss = nn.functional.cross_entropy(engine(tokens).float().flatten(0, 1), tokens.roll(1, 1).flatten())
        engine.backward(loss * 40)  # gradients far above the clipping's 0.5, so every step is clipped
        engine.step()
        zero_optimizer = engine.optimizer
        masters = zero_optimizer.single_partition_of_fp32_groups
        state = [zero_optimizer.optimizer.state[m] for m in masters]
        # each partition less its padding, whose value no weight reads (and whose gradient DeepSpeed's step and the
        # job's may fill apart)
        kept = [m.numel() - pad for m, pad in zip(masters, zero_optimizer.groups_padding)]
        seen.append({"norm": float(engine.get_global_grad_norm()),
                     "master": [m[:n].tolist() for m, n in zip(masters, kept)],
                     **{key: [s[key][:n].float().tolist() for s, n in zip(state, kept)] for key in STATE},
                     "eight_bit": [s["state1"].dtype == torch.uint8 for s in state] if fused == "bnb8" else [],
                     "step": [float(s["step"]) for s in state],
                     "weights": [p.detach().float().flatten().tolist() for p in engine.module.parameters()]})
    return seen


deepspeeds = train(engine_of(), 4, seed=1)
zero_step.zero_step_in_one_pass()
zero_step.zero_step_in_one_pass()  # installed twice: wraps once
calls = []
stepper = adamw8bit if fused == "bnb8" else adamw
real = stepper.step
stepper.step = lambda *args: calls.append(args[1]) or real(*args)  # counts the groups the job's step served
job_engine = engine_of()
jobs = train(job_engine, 4, seed=1)
job_engine.save_checkpoint(folder, tag="t")
after_job = train(job_engine, 1, seed=2)
zero.DeepSpeedZeroOptimizer.step = deepspeeds_step  # a fresh engine with DeepSpeed's own step loads it
loaded = engine_of(seed=5)
loaded.load_checkpoint(folder, tag="t")
after_loaded = train(loaded, 1, seed=2)
if rank == "0":
    print(json.dumps({"deepspeed": deepspeeds, "job": jobs, "calls": len(calls), "after_job": after_job,
                      "after_loaded": after_loaded}))

# Leave as the ranks leave (sft/ranks/train.py): at the interpreter's teardown a library thread still running now
# and then aborts the process ("terminate called without an active exception") after its result is printed.
sys.stdout.flush()
os._exit(0)
