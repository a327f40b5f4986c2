"""The fast settings train the same model as the seed's recipe: the same data, the same number of
optimizer steps of about as many tokens, and the trained models' loss on the demo data agrees
within noise (packing, auto stage, auto checkpointing against the seed's ZeRO-3 with one padded
conversation per row and checkpointing)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import DEMO_DATA, DEMO_MODEL, demo_env, read_summary, run_entrypoint

pytestmark = pytest.mark.slow

# Both runs stop after the same number of steps: the comparison is of what a step learns, not of
# the batch size (more, smaller steps lower this tiny model's loss faster at the same learning rate).
COMMON = dict(probe_steps=0, max_steps=48, logging_steps=1, learning_rate=2e-3, precision="fp32", save_steps=1000)
# The demo's conversations are under 192 tokens, so neither run truncates. The seed's step holds
# 2 ranks x 1 x 4 conversations (about 340 tokens); the packed run's 2 ranks x 1 rows of 192 tokens
# about 370.
SEED = dict(zero_stage="3", packing="false", micro_batch=1, grad_accum=4, gradient_checkpointing="true",
            max_length=192)
FAST = dict(micro_batch=1, grad_accum=1, max_length=192)  # everything else: the image's defaults


def _demo_loss(model_dir) -> float:
    """Token-weighted loss of a model over every demo conversation."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for line in DEMO_DATA.read_text().splitlines():
            text = tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=False)
            ids = torch.tensor([tokenizer(text).input_ids])
            total += model(input_ids=ids, labels=ids).loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    return total / count


def _train(tmp_path, name: str, seed: int, settings: dict) -> float:
    out = tmp_path / f"{name}-{seed}"
    result = run_entrypoint(demo_env(out, seed=seed, **COMMON, **settings))
    assert result.returncode == 0, result.stdout[-3000:]
    assert read_summary(out / "out")["train"]["global_step"] == COMMON["max_steps"]
    return _demo_loss(out / "out" / "final")


def test_fast_settings_train_as_well_as_the_seed_recipe(tmp_path):
    before = _demo_loss(DEMO_MODEL)
    seed = [_train(tmp_path, "seed", s, SEED) for s in (0, 1)]
    fast = _train(tmp_path, "fast", 0, FAST)
    assert max(seed) < 0.5 * before  # both learned
    noise = abs(seed[0] - seed[1])
    assert abs(fast - sum(seed) / 2) < max(3 * noise, 0.05 * seed[0]), (before, seed, fast)
