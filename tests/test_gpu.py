"""On a GPU: the job in bf16 with the real NCCL path, and the planner never under the measured peak.
Skipped, with the reason, on machines with no CUDA GPU (CI); run on the GPU machine with
`python -m pytest tests/test_gpu.py -m gpu`."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import demo_env, read_summary, run_entrypoint

from sft.settings.checks import flash_attention_4_installed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("stage", ["2", "3"])
def test_job_on_the_gpu_in_bf16(tmp_path, stage):
    result = run_entrypoint(demo_env(tmp_path, zero_stage=stage, probe_steps=5, max_steps=10, save_steps=5,
                                     max_length=128, learning_rate=2e-3))
    assert result.returncode == 0, result.stdout[-3000:]
    summary = read_summary(tmp_path / "out")
    # auto: FlashAttention-4 for compiled layers (ZeRO-2) where flash-attn-4 is installed, else flex attention
    attention = "flash_attention_4" if stage == "2" and flash_attention_4_installed() else "flex_attention"
    assert summary["resolved"]["attention"] == attention and summary["resolved"]["precision"] == "bf16"
    probe = json.loads((tmp_path / "out" / "run" / "probe.json").read_text())
    assert probe["device"].startswith("NVIDIA") and all(g > 0 for g in probe["peak_reserved_gib"])
    predicted = next(o["peak"] for o in summary["plan"]["options"] if o["option"] == stage)
    assert max(probe["peak_reserved_gib"]) <= predicted  # an under-prediction is a user's OOM
    if attention == "flash_attention_4":  # its kernels compiled beside the ranks' start: the ranks compiled none
        ahead = json.loads((tmp_path / "out" / "run" / "reports" / "attention-ahead.json").read_text())
        cache = tmp_path / "out" / "run" / "compile-cache" / "flash-attention"
        assert ahead["kernels"] and sorted(str(p.relative_to(cache)) for p in cache.rglob("*.o")) == ahead["kernels"]


def test_sft_gpus_naming_a_gpu_that_is_not_there_is_reported_with_the_other_problems(tmp_path):
    """SFT_GPUS is checked against the GPUs there are with the settings, all problems at once, exit 2, nothing
    written (before: a parse error hid it, and it was found only after the settings were accepted)."""
    count = torch.cuda.device_count()
    result = run_entrypoint(demo_env(tmp_path, gpus=f"0,{count}", micro_batch=0))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert problems == ["  - SFT_MICRO_BATCH='0': expected at least 1",
                        f"  - SFT_GPUS='0,{count}': this machine shows {count} GPU(s) (0-{count - 1}); no GPU {count}"]
    assert not (tmp_path / "out").exists()


# Rows split over GPUs (SFT_SEQUENCE_PARALLEL): tests/test_seqpar.py runs the same comparison on CPU ranks, where
# gloo needs every row padded to the whole SFT_MAX_LENGTH and one group of all the ranks. These are the NCCL
# paths those cannot reach: rows padded only to a multiple of N, ranks' rows of different lengths gathered by
# DeepSpeed's batch adapter, and several data-parallel groups. Not yet run: no machine with 2 GPUs was lent.
SPLIT_JOB = dict(max_length=64, packing="false", zero_stage="2", precision="fp32", attention="sdpa", compile="false",
                 probe_steps=0, logging_steps=1, micro_batch=1, grad_accum=1, learning_rate=1e-3, seed=0,
                 max_steps=20, save_steps=20)


def _token_rows(path):
    return [json.loads(line)[0] for line in path.read_text().splitlines()]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: a row split over 2 of them (NCCL)")
def test_a_row_split_over_two_gpus_gives_the_whole_rows_token_losses(tmp_path):
    runs = {}
    for name, gpus, n in (("whole", "0", 1), ("split", "0,1", 2)):
        env = demo_env(tmp_path / name, gpus=gpus, sequence_parallel=n, **SPLIT_JOB)
        env["SFTTEST_TOKEN_LOSSES"] = str(tmp_path / name / "tokens")
        result = run_entrypoint(env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[name] = tmp_path / name
    rows = _token_rows(runs["whole"] / "tokens" / "rank0.jsonl")
    halves = [_token_rows(runs["split"] / "tokens" / f"rank{r}.jsonl") for r in (0, 1)]
    assert len(rows) == len(halves[0]) == len(halves[1]) == SPLIT_JOB["max_steps"]
    for row, a, b in zip(rows, *halves):
        assert len(a) == len(b) == -(-(len(row) + 1) // 2)  # padded to a multiple of 2 only, then halved
        joined = a + b
        assert max(abs(x - y) for x, y in zip(row, joined)) < 1e-4 and not any(joined[len(row):])
    losses = [{e["step"]: e["loss"] for e in read_summary(r / "out")["train"]["log_history"] if "loss" in e}
              for r in runs.values()]
    assert losses[1] == pytest.approx(losses[0], abs=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA GPUs: rows split over 2, two data-parallel "
                    "groups (gloo cannot: its all_gather backward scatters from group ranks taken for global ones)")
def test_rows_split_over_two_of_four_gpus_train_two_groups(tmp_path):
    env = demo_env(tmp_path, gpus="0,1,2,3", sequence_parallel=2, **{**SPLIT_JOB, "probe_steps": 3})
    result = run_entrypoint(env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = read_summary(tmp_path / "out")
    assert summary["decisions"]["sequence_parallel"].endswith("2 data-parallel group(s)")
    probe = json.loads((tmp_path / "out" / "run" / "probe.json").read_text())
    assert probe["steps_per_epoch"] == 512 // 2  # two groups, one row each per step


def _fa4_runs_here() -> bool:
    from sft.settings.checks import flash_attention_4_installed

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0) and flash_attention_4_installed()


@pytest.mark.skipif(not _fa4_runs_here(), reason="needs flash-attn-4 and a GPU of compute capability 9.0 or newer")
def test_flash_attention_4_keeps_packed_sequences_apart():
    """SFT_ATTENTION=flash_attention_4 on a packed row (TRL's padding-free collator):
    each sequence's token losses equal those of the sequence alone under sdpa, and the same row with plain
    positions (one long sequence) differs, so the comparison can fail."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, Qwen3Config
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    config = Qwen3Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    sequences = [torch.randint(5, 1000, (n,)).tolist() for n in (170, 400, 93)]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": s} for s in sequences])

    def losses(logits, ids):
        return F.cross_entropy(logits[:-1].float(), ids[1:].cuda(), reduction="none")

    with torch.no_grad():
        model.set_attn_implementation("flash_attention_4")
        # as SFTTrainer passes the collator's batch: position_ids and the varlen keys (cu_seq_lens_q/k,
        # max_length_q/k: FlashAttention-4 takes the lengths as ints, not the tensors transformers would derive)
        varlen = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items() if k not in ("labels", "seq_idx")}
        packed = model(**varlen, use_cache=False).logits[0]
        leaked = model(input_ids=batch["input_ids"].cuda(), use_cache=False).logits[0]
        model.set_attn_implementation("sdpa")
        start = 0
        for seq in sequences:
            ids = torch.tensor(seq)
            alone = model(input_ids=ids[None].cuda(), use_cache=False).logits[0]
            got, want = losses(packed[start:start + len(seq)], ids), losses(alone, ids)
            torch.testing.assert_close(got, want, rtol=0, atol=0.05)  # bf16 kernels of two libraries
            if start:  # a later sequence, attending to the ones before it, drifts far beyond bf16's noise
                drift = float((losses(leaked[start:start + len(seq)], ids) - want).abs().max())
                assert drift > 0.2, drift
            start += len(seq)

    # compiled layers, as the job runs them (flash_attention_4.flash_attention_4): the same packed losses
    from sft.ranks.patches import flash_attention_4

    flash_attention_4.flash_attention_4(outside_compile=True)
    model.set_attn_implementation("flash_attention_4")
    for layer in model.model.layers:
        layer.compile()
    with torch.no_grad():
        compiled = model(**varlen, use_cache=False).logits[0]
    torch.testing.assert_close(losses(compiled, batch["input_ids"][0]), losses(packed, batch["input_ids"][0]),
                               rtol=0, atol=0.05)


def test_a_checkpoint_written_from_the_gpu_is_torch_saves_byte_for_byte(tmp_path):
    """sft/ranks/patches/saving.py's pinned ring: GPU storages in chunks, after the work queued on them, into the file
    torch.save writes; a second save reuses the ring instead of pinning more host memory."""
    from torch.utils.serialization import config

    from sft.ranks.patches import saving

    before, config.save.compute_crc32 = config.save.compute_crc32, False  # as the ranks save
    try:
        flat = torch.randn(40_000_000, device="cuda")  # 160 MB: three chunks
        obj = {"flat": flat, "view": flat[3:9], "bf16": torch.randn(1000, 999, device="cuda").bfloat16(),
               "host": torch.arange(10), "step": 5}
        pinned = []
        for turn in range(2):
            (tmp_path / f"a{turn}").mkdir(), (tmp_path / f"b{turn}").mkdir()
            flat.mul_(1.5).add_(turn)  # queued, not finished, when the save starts
            written, expected = tmp_path / f"a{turn}" / "states.pt", tmp_path / f"b{turn}" / "states.pt"
            assert saving.save(obj, written) is True
            torch.save(obj, expected)
            assert written.read_bytes() == expected.read_bytes()
            pinned.append({k: v for k, v in torch.cuda.host_memory_stats().items() if "current" in k})
        assert pinned[0] == pinned[1]
    finally:
        config.save.compute_crc32 = before


def test_a_checkpoint_written_in_the_background_from_the_gpu_is_the_tensors_as_saved(tmp_path):
    """sft/ranks/patches/background.py: GPU storages copied into pinned host memory after the work queued on them,
    the training's stream made to wait for the copy (a step queued right after the save cannot change what is
    written), the file torch.save's byte for byte, the memory pinned once and reused."""
    from torch.utils.serialization import config

    from sft.ranks.patches import background, saving

    before, config.save.compute_crc32 = config.save.compute_crc32, False  # as the ranks save
    try:
        writer = background.Writer()
        flat = torch.randn(40_000_000, device="cuda")
        obj = {"flat": flat, "view": flat[3:9], "bf16": torch.randn(1000, 999, device="cuda").bfloat16(), "step": 5}
        kept = []
        for turn in range(2):
            folder = tmp_path / f"checkpoint-{turn}" / f"global_step{turn}"
            folder.mkdir(parents=True), (tmp_path / f"b{turn}").mkdir()
            flat.mul_(1.5).add_(turn)  # queued, not finished, when the save starts
            expected = tmp_path / f"b{turn}" / "states.pt"
            torch.save(obj, expected)
            assert saving.save(obj, folder / "states.pt", writer) is True
            flat.add_(100.0)  # the next step, queued at once: after the copy
            writer.wait()
            assert (folder / "states.pt").read_bytes() == expected.read_bytes()
            kept.append(writer.arena.bytes)
        assert kept[0] == kept[1] > 0 and writer.arena.pinned
    finally:
        config.save.compute_crc32 = before


def test_the_zero_step_in_one_pass_compiled_is_torchs_fused_adamw():
    """sft/ranks/patches/adamw.py compiled on the GPU (as the job runs it under ZeRO-1/2) against torch's fused AdamW on
    the same fp32 master weights, from the bf16 gradients cast and clipped as DeepSpeed does, over three steps
    with a changing learning rate and weight decay; the bf16 weights written are the master weights rounded.
    (The eager form is held to DeepSpeed's own step by tests/test_patches.py.)"""
    from sft.ranks.patches import adamw

    generator = torch.Generator(device="cuda").manual_seed(0)
    master = torch.randn(5_000_003, device="cuda", generator=generator)  # odd: a partial last block
    reference = master.clone()
    weights = torch.empty(master.numel(), dtype=torch.bfloat16, device="cuda")
    mine = torch.optim.AdamW([master], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    torchs = torch.optim.AdamW([reference], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    for lr in (1e-3, 5e-4, 2e-4):
        gradient = torch.randn(master.numel(), device="cuda", generator=generator).bfloat16()
        scale = torch.tensor(0.37, device="cuda")
        for group in (*mine.param_groups, *torchs.param_groups):
            group["lr"] = lr
        adamw.step(mine, 0, master, gradient, weights, scale)
        reference.grad = gradient.float() * scale
        torchs.step()
        torch.testing.assert_close(master, reference, rtol=1e-6, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq"):
            # a few float32 roundings apart: the compiled lerp and multiply-adds round where torch's kernel does not
            torch.testing.assert_close(mine.state[master][key], torchs.state[reference][key], rtol=1e-5, atol=1e-7)
        assert float(mine.state[master]["step"]) == float(torchs.state[reference]["step"])
        assert torch.equal(weights, master.bfloat16())


def test_the_zero_step_in_one_pass_reaches_the_end_of_a_partition_past_2_31_elements():
    """A ZeRO partition of one GPU holds every parameter of a group (4.0 billion for Qwen3-4B): the compiled
    kernel's offsets must not wrap at 2**31. The last elements, past it, against `update` as written (on their own)."""
    from sft.ranks.patches import adamw

    n, tail = 2**31 + 4_099, 8_192
    master = torch.full((n,), 0.5, device="cuda")
    master[-tail:] = torch.randn(tail, device="cuda")
    gradient = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    gradient[-tail:] = torch.randn(tail, device="cuda").bfloat16()
    weights = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    optimizer = torch.optim.AdamW([master], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    expected = [master[-tail:].clone(), gradient[-tail:].clone(), torch.zeros(tail, device="cuda"),
                torch.zeros(tail, device="cuda"), torch.zeros(tail, dtype=torch.bfloat16, device="cuda")]
    scale, count = torch.tensor(0.5, device="cuda"), torch.ones((), device="cuda")
    adamw.step(optimizer, 0, master, gradient, weights, scale)
    adamw.update(*expected, scale, 1e-3, count, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    torch.testing.assert_close(master[-tail:], expected[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(optimizer.state[master]["exp_avg_sq"][-tail:], expected[3], rtol=1e-6, atol=1e-12)
    assert torch.equal(weights[-tail:], expected[4])
    # the rest, before the tail: every element updated alike, its 16-bit copy written
    assert float(master[0]) != 0.5 and bool((master[:-tail] == master[0]).all())
    assert bool((weights[:-tail] == master[0].bfloat16()).all())


@pytest.mark.parametrize("kept", [0, 1, 4], ids=lambda n: f"{n}-of-4-tiles-kept")
def test_the_lm_heads_kept_tiles_give_trls_numbers_on_the_gpu(kept):
    """sft/ranks/patches/lm_head.py against TRL's fused head through its Triton folds: 8,188 tokens (two token tiles) of
    a 40,000-token vocabulary (a 32,768 tile and a narrower one)."""
    from test_lm_head import compare

    compare(kept, "cuda", tokens=8188, hidden_size=256, vocab=40000, chunk=32768, exact=False)
