"""A model the project did not make: GPT-2's architecture (learned positions, Conv1D layers, its config's own names:
n_embd, n_layer, n_inner) with a byte-level BPE tokenizer trained here, which has no chat template and no pad
token. Its shape is read, its data is checked by what the rows need (a template only for conversations, or
SFT_CHAT_TEMPLATE's), and the real job trains it on Alpaca rows from a compressed CSV."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import DEMO_DATA, DEMO_MODEL, demo_env, read_summary, run_entrypoint
from sft.controller import data as data_step
from sft.controller import inputs
from sft.data import DataError
from sft.planner.inputs import Ranks
from sft.settings import Settings

TEMPLATE = DEMO_MODEL.parent / "chatml-assistant-mask.jinja"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("gpt2") / "model"
    texts = [m["content"] for line in DEMO_DATA.read_text().splitlines() for m in json.loads(line)["messages"]]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    config = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=256,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def read(tmp_path: Path, model: Path, **settings):
    small = {"max_length": 128, "micro_batch": 1, **settings}
    return data_step.read(Settings(model=str(model), output_dir=str(tmp_path / "out"), **small), Ranks(2, ()))


def text_rows(n: int) -> list[dict]:
    return [{"text": f"Question: what is {i} plus {i}? Answer: {2 * i}."} for i in range(n)]


def test_its_shape_is_read_from_gpt2s_own_config_names(gpt2, isolated_env):
    shape = inputs.model_shape(str(gpt2))
    assert (shape.hidden_size, shape.num_layers, shape.num_heads, shape.head_dim) == (64, 2, 4, 16)
    assert shape.intermediate_size == 4 * 64  # n_inner None: GPT-2's MLP is 4 x n_embd
    assert shape.vocab_size == json.loads((gpt2 / "config.json").read_text())["vocab_size"] and shape.total_params > 0


def test_a_template_is_needed_by_conversations_only_and_sft_chat_template_brings_one(gpt2, isolated_env, tmp_path):
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps(r) + "\n" for r in text_rows(40)))
    assert len(read(tmp_path, gpt2, dataset=str(text)).train) == 40
    with pytest.raises(DataError) as e:
        read(tmp_path, gpt2, dataset=str(DEMO_DATA))
    assert e.value.problems == [f"SFT_MODEL={str(gpt2)!r}: its tokenizer has no chat template, and the data is "
                                "conversational language modeling: set SFT_CHAT_TEMPLATE to a .jinja file or a model "
                                "to take the template from"]
    assert len(read(tmp_path, gpt2, dataset=str(DEMO_DATA), chat_template=str(TEMPLATE)).train) == 512
    assert inputs.problems(Settings(model=str(gpt2), dataset=str(text)), inputs.CONFIG) == []


@pytest.mark.slow
def test_the_job_trains_it_on_alpaca_rows_from_a_compressed_csv(gpt2, tmp_path):
    rows = [f"Add {i} and {i}.,{i} + {i},{2 * i}" for i in range(200)]
    data = tmp_path / "alpaca.csv.gz"
    data.write_bytes(gzip.compress(("instruction,input,output\n" + "\n".join(rows) + "\n").encode()))
    env = demo_env(tmp_path, model=gpt2, dataset=data, chat_template=TEMPLATE, max_steps=6, probe_steps=3,
                   save_steps=6, max_length=64, micro_batch=2)
    done = run_entrypoint(env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = read_summary(tmp_path / "out")
    assert summary["data"]["shape"] == "conversational prompt-completion" and summary["data"]["loss_on"] == "completion"
    assert summary["train"]["global_step"] == 6
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final")
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert AutoTokenizer.from_pretrained(tmp_path / "out" / "final").chat_template == TEMPLATE.read_text()
