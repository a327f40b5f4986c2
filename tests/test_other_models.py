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


# --- what a model folder a user brings can lack: caught before the data is read or any rank starts


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> Path:
    """Gemma2's class runs no sdpa in transformers (its _supports_sdpa is False): transformers refuses it as the
    model loads, in every rank; the demo's tokenizer, its vocabulary the model's."""
    from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

    folder = tmp_path_factory.mktemp("gemma2") / "model"
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    config = Gemma2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    Gemma2ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_the_attention_kernels_are_the_model_classs_own(gemma2, gpt2, isolated_env):
    from transformers import Gemma2ForCausalLM, GPT2LMHeadModel, Qwen3ForCausalLM

    assert inputs.attentions_of(Gemma2ForCausalLM) == ("flash_attention_4", "flex_attention", "eager")
    assert inputs.attentions_of(GPT2LMHeadModel) == ("flash_attention_4", "sdpa", "eager")
    assert inputs.attentions_of(Qwen3ForCausalLM) == ("flash_attention_4", "flex_attention", "sdpa", "eager")
    shape = inputs.model_shape(str(gemma2))
    assert (shape.model_class, shape.attentions) == ("Gemma2ForCausalLM", inputs.attentions_of(Gemma2ForCausalLM))
    assert inputs.model_shape(str(gpt2)).model_class == "GPT2LMHeadModel"


def test_a_model_without_sdpa_gets_eager_on_cpu_and_an_attention_it_lacks_is_refused_at_once(gemma2, tmp_path):
    """Before, auto chose sdpa on CPU, and both ranks failed loading Gemma2 (exit 5, a traceback each)."""
    config = run_entrypoint(demo_env(tmp_path, model=gemma2), "config")
    assert config.returncode == 0, config.stdout[-3000:] + config.stderr[-3000:]
    assert ('"attention": "eager, auto: Gemma2ForCausalLM has no sdpa in transformers (first: sdpa, auto on CPU'
            in config.stdout)
    refused = run_entrypoint(demo_env(tmp_path, model=gemma2, attention="sdpa"))
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert ("SFT_ATTENTION='sdpa': Gemma2ForCausalLM (SFT_MODEL) has no sdpa in transformers; it runs "
            "flash_attention_4, flex_attention, eager: use one of those, or auto") in refused.stdout
    assert "Traceback" not in refused.stdout + refused.stderr and "[rank" not in refused.stdout  # no rank started


def test_a_folder_without_its_weights_or_with_shards_missing_is_named(gpt2, tmp_path, isolated_env):
    import shutil

    from transformers import GPT2LMHeadModel

    bare = tmp_path / "bare"
    shutil.copytree(gpt2, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    assert inputs.problems(Settings(model=str(bare)), inputs.CONFIG) == [
        f"SFT_MODEL={str(bare)!r}: no weights in the folder (model.safetensors, pytorch_model.bin, or an index of "
        f"their shards; it holds: {', '.join(sorted(p.name for p in bare.iterdir()))}): copy the model's weight "
        "files, or save the model with its save_pretrained"]
    sharded = tmp_path / "sharded"
    GPT2LMHeadModel.from_pretrained(gpt2).save_pretrained(sharded, max_shard_size="100KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 2
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(gpt2 / name, sharded / name)
    assert inputs.problems(Settings(model=str(sharded)), inputs.CONFIG) == []
    shards[1].unlink()
    assert inputs.problems(Settings(model=str(sharded)), inputs.CONFIG) == [
        f"SFT_MODEL={str(sharded)!r}: 1 of the {len(shards)} weight files its model.safetensors.index.json names are "
        f"not in the folder ({shards[1].name}): copy the model's files again, all of them"]


def test_token_ids_beyond_the_models_vocabulary_are_named_with_the_data(tmp_path, isolated_env):
    """A model whose config.json has fewer embedding rows than its tokenizer has tokens: before, every rank failed
    at its first step with 'IndexError: index out of range in self'."""
    import shutil

    small = tmp_path / "small-vocab"
    shutil.copytree(DEMO_MODEL, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 400}))
    with pytest.raises(DataError) as e:
        read(tmp_path, small, dataset=str(DEMO_DATA))
    assert [p for p in e.value.problems if "vocab_size" in p] == [
        f"SFT_MODEL={str(small)!r}: its tokenizer gives this data token ids up to 450 (452 tokens in all), but its "
        "config.json's vocab_size is 400: the model has no embedding for ids 400 and up. Use the tokenizer the model "
        "was trained with, or resize its embeddings (resize_token_embeddings) and save it"]


def test_a_model_that_is_not_a_causal_language_model_is_named_so(tmp_path, isolated_env):
    """A vision-language model's config is read, but AutoModelForCausalLM has no class for it: before, the message
    sent the user to the network and HF_HUB_OFFLINE."""
    folder = tmp_path / "vl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(inputs.CannotRun) as e:
        inputs.shape_of(str(folder))
    assert str(e.value) == (f"SFT_MODEL={str(folder)!r}: its config.json is a Qwen2VLConfig, for which transformers "
                            "has no causal language model (AutoModelForCausalLM): this job trains text-generation "
                            "models, not vision-language, encoder or other models")


def test_a_tokenizer_without_an_end_of_sequence_token_is_named_before_any_rank_starts(gpt2, tmp_path, isolated_env):
    """A tokenizer trained from scratch with no special token: before, text rows failed the data step with 'row 1 ...
    cannot be tokenised (TypeError: endswith first arg must be str ..., not NoneType): fix or remove it', and
    conversations passed every check, then every rank failed in SFTTrainer (its pad token 'None' not in the
    vocabulary, exit 5)."""
    import shutil

    from transformers import AutoTokenizer

    bare = tmp_path / "no-eos"
    shutil.copytree(gpt2, bare)
    tok = AutoTokenizer.from_pretrained(gpt2)
    tok.eos_token = tok.bos_token = None
    tok.save_pretrained(bare)
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps(r) + "\n" for r in text_rows(40)))
    fix = ("set eos_token in the model's tokenizer_config.json to one of its tokens (the one that ends a document or a "
           """turn), or SFT_TRAINER_ARGS='{"eos_token": "..."}'""")
    for data, use in ((text, "ends each text with it"), (DEMO_DATA, "pads with it, and it has no pad token either")):
        with pytest.raises(DataError) as e:
            read(tmp_path, bare, dataset=str(data), chat_template=str(TEMPLATE))
        assert e.value.problems == [f"SFT_MODEL={str(bare)!r}: its tokenizer has no end-of-sequence token (eos_token), "
                                    f"and TRL {use}: {fix}"]
    given = read(tmp_path, bare, dataset=str(text), trainer_args='{"eos_token": "<|endoftext|>"}')
    assert given.tokenizer.eos_token == "<|endoftext|>" and len(given.train) == 40


def test_a_config_of_an_unknown_or_missing_model_type_names_the_model_type(tmp_path, isolated_env):
    """A local config.json that reads as JSON but whose model_type transformers does not know, or that has none: before,
    the message sent the user to the network and HF_HUB_OFFLINE."""
    from transformers import __version__

    for name, config in (("unknown", {"model_type": "frobnicator"}), ("untyped", {"hidden_size": 64})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    with pytest.raises(inputs.CannotRun) as e:
        inputs.shape_of(str(tmp_path / "unknown"))
    assert str(e.value).endswith(
        f"): transformers {__version__} knows no model_type 'frobnicator': a misspelt model_type, or a model newer "
        "than this transformers (a model with its own code names it in auto_map, and runs with SFT_TRUST_REMOTE_CODE)")
    with pytest.raises(inputs.CannotRun) as e:
        inputs.shape_of(str(tmp_path / "untyped"))
    assert str(e.value).endswith('): it names no model_type (the architecture, such as "llama"): add it, or save the '
                                 "config with transformers' save_pretrained")
    result = run_entrypoint(demo_env(tmp_path, model=tmp_path / "unknown"), "plan", "--gpus", "1", "--gpu-memory", "80")
    assert result.returncode == 2 and "knows no model_type 'frobnicator'" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "HF_HUB_OFFLINE" not in result.stdout + result.stderr


def test_an_unknown_model_type_is_said_once_without_transformers_base_config_warning(tmp_path):
    """AutoTokenizer, where AutoConfig knows no model_type, reads config.json as the base class and warned "You are
    using a model of type `frobnicator` to instantiate a model of type ``" above the job's own line naming it."""
    model = tmp_path / "unknown"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "frobnicator"}))
    tokenizer_files = [p for p in DEMO_MODEL.iterdir() if p.name.startswith(("tokenizer", "special_tokens"))]
    for path in tokenizer_files:  # a tokenizer AutoTokenizer can load: the warning came while it read config.json
        (model / path.name).write_bytes(path.read_bytes())
    result = run_entrypoint(demo_env(tmp_path, model=model), "data", "--rows", "0")
    said = result.stdout + result.stderr
    assert result.returncode == 2 and "knows no model_type 'frobnicator'" in said, said[-2000:]
    assert "to instantiate a model of type" not in said, said[-2000:]
