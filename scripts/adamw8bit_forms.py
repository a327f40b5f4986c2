#!/usr/bin/env python3
"""Which multiply-adds bitsandbytes' CUDA kernel has nvcc contract: each form (F1, F2, FD, FP) of the job's 8-bit
AdamW kernel (sft/ranks/patches/adamw8bit_kernel.py) against bitsandbytes' own step, three steps of 1M elements on a
GPU; prints the differing elements of each form and the best. Run it where tests/test_adamw8bit.py's GPU tests fail
after an upgrade of bitsandbytes or Triton, and make the best form the kernel's default.

    python scripts/adamw8bit_forms.py
"""
import itertools, json, os, sys, torch
import bitsandbytes as bnb
from bitsandbytes import functional as F
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sft.ranks.patches import adamw8bit_kernel as K

def run(n, forms, steps=3, wd=0.1, lr=1e-2, seed=0):
    g0 = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=g0).cuda()
    theirs = torch.nn.Parameter(start.clone())
    opt = bnb.optim.AdamW([theirs], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd, optim_bits=8)
    master, w = start.clone(), start.bfloat16()
    st = None; gg = torch.Generator().manual_seed(seed + 7); out = []
    for i in range(steps):
        grad = (torch.randn(n, generator=gg) * (10.0 ** torch.randint(-6, 1, (n,), generator=gg))).bfloat16().cuda()
        if i == 1: grad[5] = float("nan"); grad[6] = float("inf")
        scale = torch.tensor(0.5, device="cuda")
        theirs.grad = grad.float() * scale
        opt.step()
        s = opt.state[theirs]
        if st is None:
            st = {k: torch.zeros_like(s[k]) for k in ("state1", "state2", "absmax1", "absmax2")}
            st["qmap1"], st["qmap2"] = s["qmap1"], s["qmap2"]
        K.update(grad, scale, master, w, st["state1"], st["state2"], st["absmax1"], st["absmax2"], st["qmap1"],
                 st["qmap2"], (0.9, 0.95), 1e-8, lr, wd, i + 1, **forms)
        torch.cuda.synchronize()
        row = {"master": int((master != theirs.data).sum()), "w": int((w != theirs.data.bfloat16()).sum())}
        row.update({k: int((st[k] != s[k]).sum()) for k in ("state1", "state2", "absmax1", "absmax2")})
        out.append(row)
    return out

results = {}
def trial(forms):
    r = run(1_000_003, forms)
    total = sum(sum(row.values()) for row in r)
    key = "".join(str(forms[k]) for k in ("F1", "F2", "FD", "FP"))
    results[key] = {"total": total, "steps": r}
    print(forms, total, r, flush=True)
    return total
if trial(dict(F1=1, F2=1, FD=0, FP=0)) == 0:  # the kernel's default
    print("the default form agrees")
    sys.exit(0)
for f1, f2 in itertools.product(range(3), range(3)):
    if (f1, f2) != (1, 1):
        trial(dict(F1=f1, F2=f2, FD=0, FP=0))
best = min(results, key=lambda k: results[k]["total"])
for fd, fp in itertools.product(range(2), range(2)):
    if (fd, fp) != (0, 0):
        trial(dict(F1=int(best[0]), F2=int(best[1]), FD=fd, FP=fp))
best = min(results, key=lambda k: results[k]["total"])
print("best", best, results[best])
json.dump(results, open(os.path.join(os.environ.get("OUT", "/tmp"), "kexplore.json"), "w"), indent=1)
open("/tmp/forms", "w").write(best)
