"""The data as a user meets it through entrypoint.py: bad data stops the job before any rank starts, every
problem at once, exit 2, nothing written; `data` shows the first rows with the tokens that carry the loss."""

from __future__ import annotations

from conftest import DEMO_MODEL, demo_env, run_entrypoint, without_pad_token
from data_fixtures import rows, write

MARKED = DEMO_MODEL.parent / "chatml-assistant-mask.jinja"


def test_bad_data_is_refused_before_any_rank_starts_every_problem_at_once(tmp_path):
    chats = rows("messages", 20)
    chats[4]["messages"][1]["role"] = "bot"
    chats[9]["messages"] = []
    bad = write(tmp_path / "bad.jsonl", chats)
    (tmp_path / "broken.jsonl").write_text('{"messages": []}\n{"messages": [\n')
    (tmp_path / "empty.jsonl").write_text("")
    columns = write(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}])
    ev = write(tmp_path / "ev.csv", rows("standard_pc", 5))
    env = demo_env(tmp_path, dataset=f"{bad}, {tmp_path / 'broken.jsonl'}, {tmp_path / 'empty.jsonl'}, {columns}",
                   eval_dataset=str(ev), loss_on="completion")
    result = run_entrypoint(env)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    after = result.stdout.split("error: the data is not valid; nothing was started:\n")[1].splitlines()
    problems = [line.split(" ", 1)[1] for line in after]  # each line after its UTC time
    assert problems == [
        f"  - SFT_DATASET: {tmp_path / 'broken.jsonl'}, line 2: not JSON (Expecting value at column 15)",
        f"  - SFT_DATASET: {tmp_path / 'empty.jsonl'}: empty file",
        f"  - SFT_DATASET: {columns}: no column TRL can train on (found columns: question, answer); expected a "
        "'messages' column of conversations (lists of {role, content}); 'prompt' and 'completion' columns "
        "(strings, or lists of messages); a 'text' column; or Alpaca's 'instruction', 'input' and 'output'",
        "  - SFT_LOSS_ON=completion needs prompt/completion data, and this data is conversational language "
        "modeling: use assistant (conversations) or all",
        f"  - SFT_DATASET: {bad}: 1 empty conversation(s) in 'messages' (row 10): remove them",
        f"  - SFT_DATASET: {bad}: role bot in 'messages' of row 5: a role must be one of system, user, assistant, "
        "tool",
        "  - SFT_EVAL_DATASET: the evaluation data is standard prompt-completion and the training data "
        "conversational language modeling: evaluate on data of the training's shape"]
    assert "torch.distributed.run" not in result.stdout  # no rank started
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_data_command_shows_the_tokens_that_carry_the_loss(tmp_path):
    path = write(tmp_path / "chat.jsonl", rows("messages", 30))
    env = demo_env(tmp_path, dataset=str(path), loss_on="assistant", chat_template=str(MARKED), max_length=128,
                   micro_batch=1)
    result = run_entrypoint(env, "data", "--rows", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    first = [line for line in result.stdout.splitlines() if not line.startswith("data: tokens: ")][:3]
    assert first[0] == f"data: SFT_DATASET: conversational language modeling, 30 rows from {path}"
    assert first[1].startswith("data: long rows: none of the 30 training rows is longer than SFT_MAX_LENGTH=128 ")
    assert first[2] == "loss on: assistant turns only (SFT_LOSS_ON)"
    assert "pad token" not in result.stdout  # the demo's tokenizer has one
    # the first row opens with a system turn: context, as the user's; each assistant turn is learned
    assert ("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nRepeat after me: coal plum<|im_end|>\n"
            "<|im_start|>assistant\n⟦coal plum<|im_end|>⟧\n") in result.stdout
    assert not (tmp_path / "out").exists()
    tokens = run_entrypoint(env, "data", "--rows", "1", "--tokens")
    assert "    0       1        '<|im_start|>'" in tokens.stdout  # the first token: never predicted
    assert "  yes   '<|im_end|>'" in tokens.stdout
    checks_alone = run_entrypoint(env, "data", "--rows", "0")  # before: TRL's StopIteration, a traceback
    assert checks_alone.returncode == 0 and checks_alone.stdout.rstrip().endswith("loss on: assistant turns only "
                                                                                  "(SFT_LOSS_ON)"), checks_alone.stderr


def test_the_data_command_shows_a_long_row_as_its_start_and_end(tmp_path):
    long = " ".join(f"w{i}" for i in range(40_000))  # 268,889 characters: whole, they flood the terminal
    chats = [{"messages": [{"role": "user", "content": long}, {"role": "assistant", "content": "ok"}]}]
    path = write(tmp_path / "long.jsonl", chats + rows("messages", 8))
    env = demo_env(tmp_path, dataset=str(path))
    result = run_entrypoint(env, "data", "--rows", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = result.stdout.split("\nrow 1: ")[1].split("\nrow 2: ")
    whole = f"<|im_start|>⟦user\n{long}<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n⟧"  # as the template renders
    assert first.splitlines()[1:] == [*whole[:3_000].splitlines(),
                                      f"… [{len(whole) - 4_000:,} characters left out] …",
                                      *whole[-1_000:].splitlines()]
    # a short row is shown whole, as before
    assert second.splitlines()[1] == "<|im_start|>⟦system" and second.endswith("The coal is black.<|im_end|>\n⟧\n")
    assert "left out" not in second
    tokens = run_entrypoint(env, "data", "--rows", "1", "--tokens").stdout.split("\nrow 1: ")[1].splitlines()
    assert len(tokens) == 1 + 1 + 400 + 1  # the row's line, the header, 400 tokens and the line saying what is cut
    count = int(first.split()[0])  # "row 1: N tokens, ..."
    assert tokens[301].startswith("  299 ") and tokens[303].startswith(f"{count - 100} ")
    assert tokens[-1].startswith(f"{count - 1} ") and tokens[-1].endswith("'\\n'")  # the row's last token
    assert tokens[302] == f"    … [{count - 400:,} tokens left out: #300 to #{count - 101}] …"


def test_a_tokenizer_without_a_pad_token_is_said_to_pad_with_its_eos(tmp_path):
    path = write(tmp_path / "chat.jsonl", rows("messages", 30))
    env = demo_env(tmp_path, model=without_pad_token(tmp_path / "no-pad"), dataset=path, max_length=128,
                   micro_batch=1)
    result = run_entrypoint(env, "data", "--rows", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stdout.splitlines() if "pad token" in line] == [
        "data: pad token: the tokenizer has none, so TRL sets its end-of-sequence token '<|im_end|>' (id 2) as the pad "
        "token, and the saved model and tokenizer keep it; padding carries no loss, so the tokens learned are the same "
        "(to pad with another token, set pad_token in the model's tokenizer_config.json)"]


# --- a bad setting and bad data, in one round


def test_a_bad_setting_and_bad_data_are_named_in_one_round(tmp_path):
    """Before, the settings' problems stopped every command before the data was read: a user fixed them, started
    again, and only then met the data's. Now the data's problems that do not hang on a refused setting come with
    them, exit 2, nothing started or written."""
    chats = rows("messages", 20)
    chats[9]["messages"] = []
    bad = write(tmp_path / "bad.jsonl", chats)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": []}\n{"messages": [\n')
    env = {**demo_env(tmp_path, dataset=f"{bad}, {broken}", learning_rate="abc"), "SFT_EPOCH": "2"}
    for command in ("run", "config", "data"):
        result = run_entrypoint(env, command)
        assert result.returncode == 2, command + result.stdout[-3000:] + result.stderr[-3000:]
        assert "Traceback" not in result.stdout + result.stderr
        said = result.stderr[result.stderr.index("error: the settings are not valid"):].splitlines()
        assert said == [
            "error: the settings are not valid; nothing was started:",
            "  - SFT_EPOCH: unknown setting (did you mean SFT_EPOCHS?)",
            "  - SFT_LEARNING_RATE='abc': expected a number",
            "error: the data is not valid; nothing was started:",
            f"  - SFT_DATASET: {broken}, line 2: not JSON (Expecting value at column 15)",
            f"  - SFT_DATASET: {bad}: 1 empty conversation(s) in 'messages' (row 10): remove them"], command
        assert "torch.distributed.run" not in result.stdout + result.stderr  # no rank started
        assert not (tmp_path / "out").exists()  # nothing written


def _beside(tmp_path, **settings) -> list[str]:
    """rowchecks.beside on the settings of the demo's environment with these, as the commands call it."""
    from sft.controller import prepare
    from sft.controller.rowchecks import beside

    s, problems = prepare.settings(demo_env(tmp_path, **settings))
    assert problems, "the test needs a refused setting"
    return beside(s, problems)


def test_the_data_checks_that_read_a_refused_setting_are_left_out(tmp_path, isolated_env):
    """A refused setting holds its default, not the user's value: the checks that read it would judge the wrong
    data (a typo of SFT_DATASET's name: the default's) or the wrong rule, so they wait for the fix."""
    chats = rows("messages", 20)
    chats[3]["messages"][-1]["content"] = ""  # teaches nothing: refused by SFT_EMPTY_ROWS=error, the default
    chats[9]["messages"] = []
    path = write(tmp_path / "chat.jsonl", chats)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [\n')
    empty_row = f"SFT_DATASET: {path}: 1 row(s) teach nothing"
    empty_conversation = f"SFT_DATASET: {path}: 1 empty conversation(s) in 'messages' (row 10): remove them"
    found = _beside(tmp_path, dataset=path, learning_rate="abc", loss_on="completion")
    assert [p[:len(empty_row)] for p in found] == [
        "SFT_LOSS_ON=completion needs prompt/completion data, and this data is conversational language modeling: "
        "use assistant (conversations) or all"[:len(empty_row)], empty_row, empty_conversation[:len(empty_row)]]
    # SFT_EMPTY_ROWS and SFT_LOSS_ON refused: their checks are left out, the others still run
    assert _beside(tmp_path, dataset=path, empty_rows="dorp", loss_on="completions") == [empty_conversation]
    # the sources themselves refused, or named by a typo: nothing of the data is read
    assert _beside(tmp_path, dataset=f"{broken}, {path}:x") == []
    assert _beside(tmp_path, dataset=broken, datset="chat.jsonl") == []
    assert _beside(tmp_path, dataset=broken, config=tmp_path / "no-such-job.yaml") == []  # it may name SFT_DATASET
    (typo := tmp_path / "typo.yaml").write_text("datset: chat.jsonl\n")  # an unknown key: the file is in doubt
    assert _beside(tmp_path, dataset=broken, config=typo) == []
    # a value of the job file refused: that setting, not the file, whose dataset stands
    (job := tmp_path / "job.yaml").write_text(f"learning_rate: abc\ndataset: {path}\n")
    found = _beside(tmp_path, config=job, dataset="")  # an empty variable leaves the file's value
    assert [p[:len(empty_row)] for p in found] == [empty_row, empty_conversation[:len(empty_row)]]
    # the long rows need SFT_MAX_LENGTH and the tokens: the data step's, after the fix; good data says nothing
    good = write(tmp_path / "good.jsonl", rows("messages", 4))
    assert _beside(tmp_path, dataset=good, max_length="abc") == []
    # a Hub dataset waits for the data step (no download before the settings are fixed)
    assert _beside(tmp_path, dataset="trl-lib/Capybara", learning_rate="abc") == []
