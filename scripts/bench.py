#!/usr/bin/env python3
"""The seed's recipe against the image's own settings, on the same GPU, model shape and data.

Each configuration runs through the job's own entrypoint (`entrypoint.py probe`), so what is timed is
what users run. Prints tokens/s (non-padding, steady state), MFU, peak memory and the ratio to the seed.

MFU per GPU = tokens/s / GPUs x 6 x N / peak, N = the parameters in a matrix multiplication per token:
all of them, less the input embedding unless it is tied to the output layer (Qwen3-4B ties it: N = 4.02e9).
Peak: 790e12 bf16 FLOP/s, measured on this workplace's H200. "MFU+attn" adds attention's FLOPs per token,
12 x layers x (heads x head_dim) x c, c the mean causal context of a token: sum(l^2) / (2 sum(l)) over the
data's conversations, each cut at max_length l (fwd 4 x q_dim x c for QK^T and AV, bwd twice that); packed
conversations attend only to themselves, so it is their lengths that count, not the row's.

    python scripts/bench.py --model DIR --data FILE [--configs seed,default,...] [--steps 12] [--set max_length=65536]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
PEAK_FLOPS = 790e12
# The seed's recipe as its sft_ds.py writes it, and the levers measured against it. Each names every
# setting it measures, so a later change of the defaults does not change what a name means.
NO_LIGER = dict(liger_kernels="false")
CONFIGS = {
    "seed": dict(zero_stage="3", packing="false", micro_batch=1, grad_accum=4, gradient_checkpointing="true",
                 attention="sdpa", compile="false", **NO_LIGER),
    "seed-zero2": dict(zero_stage="2", packing="false", micro_batch=1, grad_accum=4, gradient_checkpointing="true",
                       attention="sdpa", compile="false", **NO_LIGER),
    "default": dict(),  # the image's defaults, nothing set
    "adamw": dict(optimizer="adamw"),  # the defaults with full-precision AdamW state, whatever auto would take
    "adamw-8bit": dict(optimizer="adamw-8bit"),  # ... with bitsandbytes' 8-bit AdamW state
    "pack-z2-mb1-ckpt": dict(zero_stage="2", micro_batch=1, grad_accum=4, gradient_checkpointing="true",
                             attention="sdpa", **NO_LIGER),
    "pack-z2-mb2-nockpt": dict(zero_stage="2", micro_batch=2, grad_accum=2, gradient_checkpointing="false",
                               attention="sdpa", **NO_LIGER),
    "pack-z2-mb4-ckpt": dict(zero_stage="2", micro_batch=4, grad_accum=1, gradient_checkpointing="true",
                             attention="sdpa", **NO_LIGER),
    # the defaults of the first session: 2 x 2 packed rows, flex, no checkpointing (the planner's pick)
    "pack-z2-mb2-nockpt-flex": dict(zero_stage="2", micro_batch=2, grad_accum=2, gradient_checkpointing="false",
                                    attention="flex_attention", **NO_LIGER),
    # levers against that row
    "liger": dict(micro_batch=2, grad_accum=2, gradient_checkpointing="false", liger_kernels="true"),
    "ga8": dict(micro_batch=2, grad_accum=8, gradient_checkpointing="false", **NO_LIGER),
    "mb4-ckpt": dict(micro_batch=4, grad_accum=1, gradient_checkpointing="true", **NO_LIGER),
    "mb4-ckpt-liger": dict(micro_batch=4, grad_accum=1, gradient_checkpointing="true", liger_kernels="true"),
    "mb4-liger": dict(micro_batch=4, grad_accum=1, gradient_checkpointing="false", liger_kernels="true",
                      batch_search="false"),
    "mb4-liger-z1": dict(zero_stage="1", micro_batch=4, grad_accum=1, gradient_checkpointing="false",
                         liger_kernels="true", batch_search="false"),
    "compile": dict(compile="true"),
    "compile-noliger": dict(compile="true", liger_kernels="false"),
    "compile-sdpa": dict(compile="true", attention="sdpa"),
    "noliger": dict(liger_kernels="false"),
    # the defaults before SFT_COMPILE (2026-11-29 to 12-01): everything else as today
    "default-nocompile": dict(compile="false"),
    # accelerate's regional compilation: each decoder layer compiled once and reused. Since 2026-12-02 the job
    # compiles this way whenever it compiles (sft/ranks/train.py::regional_compilation), so "compile" and
    # "compile-layers" are alike, and so are the two configurations below (with 55862eb, compile-noliger-nockpt compiled the whole model).
    "compile-layers": dict(compile="true", env={"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "1"}),
    # compiled without Liger's kernels (which turn the compiled loss NaN) and without checkpointing, at ZeRO-2
    # (before 2026-12-02 the planner counted the uncompiled model's activations, which do not fit without Liger)
    "compile-noliger-nockpt": dict(compile="true", liger_kernels="false", zero_stage="2",
                                   gradient_checkpointing="false"),
    "compile-layers-noliger-nockpt": dict(compile="true", liger_kernels="false", zero_stage="2",
                                          gradient_checkpointing="false",
                                          env={"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "1"}),
    # twice the tokens per optimizer step: the step's fixed cost spread over twice the work
    "default-ga2": dict(micro_batch=4, grad_accum=2, batch_search="false"),
    "default-ga4": dict(micro_batch=4, grad_accum=4, batch_search="false"),
    # the same through the setting a user would change (the batch search picks the split)
    "tokens-16k": dict(tokens_per_step=16384),
    "noliger-16k": dict(compile="true", liger_kernels="false", tokens_per_step=16384),
    # the defaults of 2026-12-01 (compiled, Liger, 8,192 tokens a step), whatever the defaults become
    "compile-liger-8k": dict(compile="true", liger_kernels="true", tokens_per_step=8192),
    # ZeRO-2 with the shipped file's two bucket options off (SFT_DS_CONFIG written from it): on one GPU there is
    # no reduce to overlap, and contiguous_gradients copies each gradient into a buffer after its hook
    "z2-plain": dict(zero_stage="2", zero={"overlap_comm": False, "contiguous_gradients": False}),
    "z2-nooverlap": dict(zero_stage="2", zero={"overlap_comm": False}),
    "fa4": dict(attention="flash_attention_4"),
    # where the defaults' probe ended for Qwen3-4B on one H100 (2026-12-06): 8-bit state, 2 x 2 without checkpointing
    "8bit-2x2": dict(zero_stage="2-8bit", micro_batch=2, grad_accum=2, gradient_checkpointing="false",
                     batch_search="false"),
    "flex": dict(attention="flex_attention"),  # the defaults before auto chose FlashAttention-4 where installed
    "fa4-nocompile": dict(attention="flash_attention_4", compile="false"),
    # the defaults' settings when issue 16 was filed (2026-12-01): uncompiled, Liger's kernels, flex attention,
    # 8,192 tokens a step; on the code of the day it runs, so its one-pass step and host reads count in it
    "issue16-defaults": dict(compile="false", liger_kernels="true", attention="flex_attention", tokens_per_step=8192),
    # those with compile: each layer compiled with flex attention, Liger off (compiled with Liger the loss is NaN)
    "issue16-compile": dict(compile="true", liger_kernels="false", attention="flex_attention", tokens_per_step=8192),
}


def matmul_params(model: str) -> int:
    """N for MFU: every parameter, less the input embedding unless tied to the output layer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in m.parameters())
    return total if cfg.tie_word_embeddings else total - m.get_input_embeddings().weight.numel()


def attention_flops_per_token(model: str, data: str, max_length: int, sample: int = 400) -> float:
    """12 x layers x q_dim x mean causal context, over the first `sample` conversations (see the docstring)."""
    from transformers import AutoConfig, AutoTokenizer

    cfg, tok = AutoConfig.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    lengths = []
    with open(data) as f:
        for line, _ in zip(f, range(sample)):
            ids = tok.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=False)
            lengths.append(min(len(ids), max_length))
    context = sum(n * n for n in lengths) / (2 * sum(lengths))
    q_dim = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    return 12 * cfg.num_hidden_layers * q_dim * context


def run_probe(name: str, model: str, data: str, steps: int, work: Path, settings: dict,
              profile_step: int = 0, timeline: str | None = None) -> dict:
    """`entrypoint.py probe` with these SFT_* settings (and a config's own `env`) into WORK/NAME; its
    probe.json figures, and with profile_step the profile of that step (sft/dev/profiling.py)."""
    settings = dict(settings)
    if "zero" in settings:  # the shipped config of the stage, with these zero_optimization keys, as SFT_DS_CONFIG
        sys.path.insert(0, str(REPO))
        from sft.stages import shipped_config
        config = shipped_config(settings.pop("zero_stage"))
        config["zero_optimization"].update(settings.pop("zero"))
        (work / f"{name}.ds.json").write_text(json.dumps(config, indent=1))
        settings["ds_config"] = str(work / f"{name}.ds.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFT_")}
    env.update(SFT_MODEL=model, SFT_DATASET=data, SFT_PROBE_STEPS=str(steps), SFT_OUTPUT_DIR=str(work / name),
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **settings.pop("env", {}))
    if profile_step:
        env["SFTDEV_PROFILE_STEP"] = str(profile_step)
        env["SFTDEV_PROFILE_TIMELINE"] = timeline or "0"
    env.update({f"SFT_{k.upper()}": str(v) for k, v in settings.items()})
    start = time.time()
    with open(work / f"{name}.log", "w") as log:
        code = subprocess.call([sys.executable, str(REPO / "entrypoint.py"), "probe"], env=env, cwd=REPO,
                               stdout=log, stderr=subprocess.STDOUT)
    probe_file, summary_file = work / name / "run" / "probe.json", work / name / "run" / "summary.json"
    fig = json.loads(probe_file.read_text()) if probe_file.exists() else {}
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    used = summary.get("resolved") or {}  # what ran: the batch search's split, auto's checkpointing and Liger
    split = {k: used[k] for k in ("micro_batch", "grad_accum", "gradient_checkpointing", "liger_kernels") if k in used}
    profile = work / name / "run" / "reports" / "profile-rank0.json"
    gaps = work / name / "run" / "reports" / "profile-rank0.gaps.txt"
    report = work / name / "run" / "reports" / "probe-rank0.json"
    rank0 = json.loads(report.read_text()) if report.exists() else {}
    history = rank0.get("log_history", [])
    # seconds from this script's launch of the entrypoint to rank 0's first step: the job's own figure
    # (seconds_to_first_step) on this script's clock, the same for any version of the job
    launched = {"launch_to_first_step": round(rank0["first_step_wall"] - start, 1)} if rank0.get(
        "first_step_wall") else {}
    return {"name": name, "exit": code, "wall_s": round(time.time() - start), **split, **fig, **launched,
            "batch_search": summary.get("batch_search"), "phases": summary.get("phases"),
            "profile": json.loads(profile.read_text()) if profile.exists() else None,
            "gaps": gaps.read_text() if gaps.exists() else None,
            "losses": [[h["step"], h["loss"], h.get("grad_norm")] for h in history if "loss" in h]}


@click.command()
@click.option("--model", required=True, help="Model folder (scripts/make_synthetic.py makes one).")
@click.option("--data", required=True, help="Chat data (.jsonl).")
@click.option("--configs", default="seed,default", show_default=True, help="Comma-separated names: " +
              ", ".join(CONFIGS))
@click.option("--steps", default=12, show_default=True, help="Probe steps per configuration.")
@click.option("--work", default="/tmp/bench", type=click.Path(path_type=Path), help="Scratch folder.")
@click.option("--gpus", default="all", show_default=True, help="SFT_GPUS for every configuration.")
@click.option("--profile-step", default=0, show_default=True, help="Profile this probe step of each configuration "
              "(0: none): its time by phase and kernel kind. Its synchronisations and the trace's export fall in "
              "the steady window: profile in a run of its own, not in one whose throughput you report.")
@click.option("--timeline", is_flag=True, help="With --profile-step: profile the step as it runs, nothing "
              "synchronised, and report the GPU's idle time by what the host ran (Python stacks).")
@click.option("--light", is_flag=True, help="With --timeline: record no Python stacks (recording them slows the "
              "host several times, which makes idle time of its own); the idle time by phase, host op and the "
              "longest gaps, at the host's own speed.")
@click.option("--set", "extra", multiple=True, help="KEY=VALUE: an SFT_ setting for every configuration, e.g. "
              "max_length=65536.")
@click.option("--steps-for", multiple=True, help="NAME=STEPS: probe steps for one configuration (e.g. seed=12: "
              "the seed's steps are 8x slower).")
def main(model: str, data: str, configs: str, steps: int, work: Path, gpus: str, profile_step: int,
         timeline: bool, light: bool, extra: tuple[str, ...], steps_for: tuple[str, ...]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    n = matmul_params(model)
    common = dict(kv.split("=", 1) for kv in extra)
    attn = attention_flops_per_token(model, data, int(common.get("max_length", 2048)))
    click.echo(f"attention: {attn / 1e9:.2f} GFLOP per token (6N: {6 * n / 1e9:.2f})", err=True)
    own_steps = {name: int(n) for name, n in (kv.split("=", 1) for kv in steps_for)}
    rows = []
    for name in configs.split(","):
        row = run_probe(name, model, data, own_steps.get(name, steps), work,
                        settings={**CONFIGS[name], "gpus": gpus, **common}, profile_step=profile_step,
                        timeline=("light" if light else "stacks") if timeline else None)
        if "tokens_per_second" in row:
            row["mfu"] = row["tokens_per_second"] / row["world_size"] * 6 * n / PEAK_FLOPS
            row["mfu_attn"] = row["tokens_per_second"] / row["world_size"] * (6 * n + attn) / PEAK_FLOPS
        rows.append(row)
        click.echo(json.dumps(row), err=True)
        (work / "bench.json").write_text(json.dumps(rows, indent=1))  # after each row: a cut-off run keeps them
    seed = next((r.get("tokens_per_second") for r in rows if r["name"] == "seed"), None)
    click.echo(f"\nN = {n:,} parameters in matmuls per token; peak {PEAK_FLOPS / 1e12:.0f} TFLOP/s")
    click.echo(f"{'config':<26} {'exit':>4} {'stage':>6} {'batch':>6} {'ckpt':>5} {'liger':>5} {'tokens/s':>9} "
               f"{'MFU/GPU':>7} {'+attn':>6} {'s/step':>7} {'peak GiB':>9} {'x seed':>7}")
    for r in rows:
        tps = r.get("tokens_per_second")
        ratio = f"{tps / seed:.2f}" if tps and seed else "-"
        peak = max(r.get("peak_reserved_gib") or [0])
        batch = f"{r['micro_batch']}x{r['grad_accum']}" if "micro_batch" in r else "-"
        yes_no = {True: "on", False: "off"}
        click.echo(f"{r['name']:<26} {r['exit']:>4} {r.get('stage', '-'):>6} {batch:>6} "
                   f"{yes_no.get(r.get('gradient_checkpointing'), '-'):>5} "
                   f"{yes_no.get(r.get('liger_kernels'), '-'):>5} "
                   f"{tps or 0:>9.0f} "
                   f"{r.get('mfu', 0):>7.1%} {r.get('mfu_attn', 0):>6.1%} {r.get('seconds_per_step', 0):>7.2f} "
                   f"{peak:>9.1f} {ratio:>7}")
    for r in rows:
        for t in (r.get("batch_search") or {}).get("tries", []):
            tps = t.get("tokens_per_second")
            click.echo(f"  {r['name']}'s batch search: {t['micro_batch']}x{t['grad_accum']} checkpointing "
                       f"{'on' if t['gradient_checkpointing'] else 'off'}: " +
                       (f"{tps:.0f} tokens/s, {tps / r['world_size'] * 6 * n / PEAK_FLOPS:.1%} MFU/GPU, peak "
                        f"{max(t.get('peak_reserved_gib') or [0]):.1f} GiB" if tps else t.get("out_of_memory", "-")))
    for r in rows:
        click.echo(f"  {r['name']}: {r.get('seconds_to_first_step', '-')} s from start to the first step "
                   f"({r.get('launch_to_first_step', '-')} s from this script's launch), "
                   f"warm-up {r.get('warmup_seconds', '-')} s beyond the steady rate; phases {r.get('phases')}")
        if r.get("profile"):
            click.echo(profile_table(r["name"], r["profile"]))
        if r.get("gaps"):
            click.echo(f"  {r['name']}'s step as it ran:\n" + r["gaps"])
    (work / "bench.json").write_text(json.dumps(rows, indent=1))


def profile_table(name: str, p: dict) -> str:
    """One profiled step by phase: wall seconds, then GPU seconds by kernel kind and idle."""
    if "error" in p:
        return f"  {name}: the profile of step {p['profiled_step']} failed: {p['error']}"
    kinds = sorted({k for phase in ("forward", "backward", "step") for k in p[phase]["kernels_seconds"]})
    lines = [f"  {name}: step {p['profiled_step']}, {p['wall_seconds']:.3f} s (synchronised at each phase)",
             f"    {'phase':<9}{'wall':>8}" + "".join(f"{k:>14}" for k in kinds) + f"{'idle':>8}"]
    for phase in ("forward", "backward", "step"):
        row = p[phase]
        lines.append(f"    {phase:<9}{row['wall_seconds']:>8.3f}" + "".join(
            f"{row['kernels_seconds'].get(k, 0):>14.3f}" for k in kinds) + f"{row['idle_seconds']:>8.3f}")
    lines += [f"      {s:>7.3f} s  {n[:100]}" for n, s in p["top_kernels_seconds"][:12]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
