"""Which tokens carry the loss, per SFT_LOSS_ON, proven on the tiny model's own chat template (with the
{% generation %} markers TRL needs for assistant-only loss, rendering the same text), packed and unpacked.

Each mode is checked two ways: against TRL's real SFTTrainer (the labels its dataset preparation and
collator give, built here on the tiny model), and by decoding the runs of labelled tokens, which must be
exactly the assistant turns, the completions, or everything."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import DEMO_MODEL, without_pad_token
from data_fixtures import rows
from sft.data import show
from sft.data.tokens import IGNORED, Labeller, in_memory, pad_note, tokenizer

pytestmark = pytest.mark.usefixtures("offline")  # TRL's SFTTrainer looks the model up on the Hub otherwise

MARKED = DEMO_MODEL.parent / "chatml-assistant-mask.jinja"
END = "<|im_end|>"


def real_trainer(tmp_path, data, loss_on: str, packing: bool, chat_template=None, model=DEMO_MODEL):
    """TRL's SFTTrainer on the tiny model as the ranks build it (without DeepSpeed): its prepared rows."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=128, packing=packing, report_to="none",
                     bf16=False, use_cpu=True, per_device_train_batch_size=2,
                     assistant_only_loss=loss_on == "assistant", completion_only_loss=loss_on == "completion",
                     chat_template_path=chat_template)
    return SFTTrainer(model=str(model), args=args, train_dataset=Dataset.from_list(data))


def ours(data, loss_on: str, packing: bool, chat_template=None):
    """The job's own preparation (sft/data/tokens.py), as the controller and `data` run it."""
    from datasets import Dataset

    labeller = Labeller(tokenizer(str(DEMO_MODEL), None, chat_template), loss_on, 128)
    return labeller, labeller.prepare(in_memory(Dataset.from_list(data), 0, len(data)), packing=packing)


def runs(tok, ids: list[int], labels: list[int]) -> list[str]:
    """The text of each run of consecutive labelled tokens, the first token left out (never predicted)."""
    found, run = [], []
    for token, label in zip(ids, show.learned_labels(labels), strict=True):
        if label != IGNORED:
            run.append(token)
        elif run:
            found, run = found + [tok.decode(run)], []
    return found + ([tok.decode(run)] if run else [])


def test_the_marked_template_renders_as_the_tiny_models_own():
    plain = tokenizer(str(DEMO_MODEL), None, None)
    marked = tokenizer(str(DEMO_MODEL), None, str(MARKED))
    for chat in (r["messages"] for r in rows("messages", 30)):
        for prompt in (False, True):
            assert plain.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt) == \
                marked.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)


CASES = [  # (shape, SFT_LOSS_ON, the text of the labelled runs of a row, given its text and first token's)
    ("messages", "all", lambda r, text, first: [text[len(first):]]),
    ("messages", "assistant", lambda r, text, first: [m["content"] + END for m in r["messages"]
                                                      if m["role"] == "assistant"]),
    ("conversational_pc", "completion", lambda r, text, first: [r["completion"][0]["content"] + END + "\n"]),
    ("conversational_pc", "assistant", lambda r, text, first: [m["content"] + END for m in r["prompt"] + r["completion"]
                                                               if m["role"] == "assistant"]),
    ("standard_pc", "completion", lambda r, text, first: [r["completion"] + END]),
    ("standard_pc", "all", lambda r, text, first: [text[len(first):]]),
    ("text", "all", lambda r, text, first: [text[len(first):]]),
]


@pytest.mark.parametrize("shape,loss_on,expected", CASES, ids=[f"{s}-{m}" for s, m, _ in CASES])
def test_the_labelled_tokens_are_what_the_mode_says_and_what_trl_trains_on(tmp_path, shape, loss_on, expected):
    data = rows(shape, 12)
    template = str(MARKED) if loss_on == "assistant" else None
    labeller, prepared = ours(data, loss_on, packing=False, chat_template=template)
    tok = labeller.tok
    trainer = real_trainer(tmp_path, data, loss_on, packing=False, chat_template=template)
    for row, mine, theirs in zip(data, prepared, trainer.train_dataset, strict=True):
        assert (mine["input_ids"], mine["labels"]) == (theirs["input_ids"], theirs["labels"])
        text, first = tok.decode(mine["input_ids"]), tok.decode(mine["input_ids"][:1])
        assert runs(tok, mine["input_ids"], mine["labels"]) == expected(row, text, first)


@pytest.mark.parametrize("shape,loss_on", [("messages", "assistant"), ("standard_pc", "completion"),
                                           ("conversational_pc", "completion"), ("text", "all")])
def test_packing_keeps_each_rows_labels_and_masks_each_first_token(tmp_path, shape, loss_on):
    data = rows(shape, 24)
    template = str(MARKED) if loss_on == "assistant" else None
    _, unpacked = ours(data, loss_on, packing=False, chat_template=template)
    _, packed = ours(data, loss_on, packing=True, chat_template=template)
    trainer = real_trainer(tmp_path, data, loss_on, packing=True, chat_template=template)
    assert packed["input_ids"] == trainer.train_dataset["input_ids"]
    assert packed["labels"] == trainer.train_dataset["labels"]
    assert len(packed) < len(unpacked)  # rows were packed together
    pieces = []
    for row in packed:
        start = 0
        for length in row["seq_lengths"]:
            pieces.append(json.dumps([row["input_ids"][start:start + length], row["labels"][start:start + length]]))
            start += length
    assert sorted(pieces) == sorted(json.dumps([r["input_ids"], r["labels"]]) for r in unpacked)
    batch = next(iter(trainer.get_train_dataloader()))  # TRL's padding-free collator, as the ranks get it
    starts = batch["position_ids"][0] == 0
    assert starts.sum() > 1 and (batch["labels"][0][starts] == IGNORED).all()
    inside = ~starts & (batch["labels"][0] != IGNORED)
    assert inside.any() and torch.equal(batch["labels"][0][inside], batch["input_ids"][0][inside])


def test_a_template_taken_from_a_model_folder_labels_as_trl_clones_it(tmp_path):
    """SFT_CHAT_TEMPLATE naming a model: TRL's clone_chat_template, mirrored for the tokenizer alone."""
    source = tmp_path / "source"
    shutil.copytree(DEMO_MODEL, source)
    shutil.copy(MARKED, source / "chat_template.jinja")
    data = rows("messages", 6)
    _, prepared = ours(data, "assistant", packing=False, chat_template=str(source))
    trainer = real_trainer(tmp_path, data, "assistant", packing=False, chat_template=str(source))
    assert prepared["labels"] == trainer.train_dataset["labels"]
    assert any(label == IGNORED for label in prepared["labels"][0])


def test_the_data_command_marks_the_labelled_runs():
    from datasets import Dataset

    data = rows("standard_pc", 2)
    labeller = Labeller(tokenizer(str(DEMO_MODEL), None, None), "completion", 12)
    shown = show.render(Dataset.from_list(data), labeller, 1, packing=False)
    prompt, completion = data[0]["prompt"], data[0]["completion"]
    assert f"{prompt}{show.OPEN}{completion}{END}{show.CLOSE}" in shown
    assert "row 1: " in shown and "carry the loss; it is cut to its first 12 (SFT_MAX_LENGTH)" in shown


def test_a_tokenizer_without_a_pad_token_pads_with_its_eos_as_the_log_says(tmp_path):
    model = without_pad_token(tmp_path / "no-pad")
    tok = tokenizer(str(model), None, None)
    eos = tok.convert_tokens_to_ids(END)
    assert f"end-of-sequence token '{END}' (id {eos}) as the pad token" in pad_note(tok, {})
    trainer = real_trainer(tmp_path, rows("messages", 2), "all", packing=False, model=model)
    # TRL's choice, on the tokenizer and on the model's configs that save_model writes (not the config's own 0)
    assert trainer.processing_class.pad_token == END
    assert trainer.model.config.pad_token_id == trainer.model.generation_config.pad_token_id == eos != 0
    assert pad_note(tokenizer(str(DEMO_MODEL), None, None), {}) is None  # the demo's has one: <|endoftext|>
    assert pad_note(tok, {"pad_token": "<|endoftext|>"}) is None  # SFT_TRAINER_ARGS' (deprecated in TRL) is used


def test_sft_trainer_args_eos_token_ends_the_rows_the_ranks_train_on_as_trls_own(tmp_path, isolated_env):
    """The ranks train on the data step's tokens (TRL skips its own tokenisation of them). Before, that step ended each
    text with the tokenizer's eos while TRL's trainer, given SFT_TRAINER_ARGS' eos_token, ends them with that one; and
    an eos_token the vocabulary lacks failed in every rank instead of before any started."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from sft.controller import data as data_step
    from sft.data import DataError
    from sft.planner.inputs import Ranks
    from sft.settings import Settings

    data = [{"text": f"Some text {i}."} for i in range(8)]
    path = tmp_path / "text.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    settings = dict(model=str(DEMO_MODEL), dataset=str(path), output_dir=str(tmp_path / "out"), max_length=128,
                    micro_batch=1, packing=False)
    found = data_step.read(Settings(**settings, trainer_args='{"eos_token": "<|endoftext|>"}'), Ranks(2, ()))
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_length=128, report_to="none", bf16=False, use_cpu=True,
                     eos_token="<|endoftext|>")
    trainer = SFTTrainer(model=str(DEMO_MODEL), args=args, train_dataset=Dataset.from_list(data))
    theirs = trainer.train_dataset["input_ids"]
    assert [found.tokens.rows[i]["input_ids"] for i in range(len(data))] == theirs
    assert theirs[0][-1] == found.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    with pytest.raises(DataError) as e:
        data_step.read(Settings(**settings, trainer_args='{"eos_token": "</s>"}'), Ranks(2, ()))
    assert e.value.problems == [
        """SFT_TRAINER_ARGS='{"eos_token": "</s>"}': eos_token '</s>': not a token of SFT_MODEL's tokenizer (452 """
        "tokens): name one of its tokens, such as '<|im_end|>'"]
