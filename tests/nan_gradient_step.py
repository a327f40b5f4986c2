"""One DeepSpeed ZeRO-2 step whose gradient holds a NaN while its loss is finite, with the job's shipped config
(bf16, DeepSpeed's overflow check off) or with the check on; then the ranks' own checks on it, as at a log and
before a save. Real DeepSpeed on CPU (gloo, one process). Prints one JSON line.
Usage: python -m tests.nan_gradient_step {shipped|check} PORT, from the repository root (run by
tests/test_diverged.py)."""

import json
import os
import sys
from types import SimpleNamespace

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from sft.ranks.progress import ProgressCallback, not_finite  # noqa: E402
from sft.stages import shipped_config  # noqa: E402

config = shipped_config("2")
config.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=1,
              gradient_clipping=1.0)
config["bf16"]["enabled"] = True
if sys.argv[1] == "check":
    config["bf16"]["check_grad_overflow"] = True

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
groups = [{"params": [p for n, p in model.named_parameters() if n.endswith(kind)], "weight_decay": decay}
          for kind, decay in (("weight", 0.01), ("bias", 0.0))]  # two groups, as the Trainer makes them
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=1e-2), config=config)
x, y = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, 4)


def step(nan: bool) -> float:
    hook = engine.module[2].weight.register_hook(lambda g: torch.full_like(g, float("nan"))) if nan else None
    loss = nn.functional.mse_loss(engine(x).float(), y)
    engine.backward(loss)
    engine.step()
    if hook:
        hook.remove()
    return float(loss)


step(False)
loss = step(True)
callback = ProgressCallback.__new__(ProgressCallback)
callback.trainer = SimpleNamespace(_tr_loss=torch.tensor(loss), model_wrapped=engine)
norm, applied = callback._last_step()
try:
    callback._refuse_to_save_diverged(SimpleNamespace(global_step=2))
    at_save = None
except Exception as e:  # what the ranks would stop with
    at_save = f"{type(e).__name__}: {e}"
logged = not_finite({"loss": loss, "grad_norm": norm}, 2, applied)
print(json.dumps({"loss": loss, "grad_norm": norm, "applied": applied, "at_save": at_save,
                  "at_log": logged and str(logged),
                  "weights_nan": any(bool(p.float().isnan().any()) for p in engine.module.parameters())}))

# Leave as the ranks leave (sft/ranks/train.py): at the interpreter's teardown a library thread still running now
# and then aborts the process ("terminate called without an active exception") after its result is printed.
sys.stdout.flush()
os._exit(0)
