"""The user's data, shared by the controller (which checks it before any rank starts) and the ranks (which
train on it through the same code):

    sources.py  loading each source with `datasets`, drawing the mixture, holding out the evaluation rows
    files.py    why a local file cannot be read: the empty file, the bad JSON line (datasets names neither),
                through its compression (.gz, .bz2, .xz)
    shapes.py   which of TRL's dataset shapes the rows have, by TRL's own rules
    alpaca.py   Alpaca's instruction/input/output rows as TRL's conversational prompt/completion
    system.py   a 'system' column beside conversations (ShareGPT's) as their first message
    checks.py   every problem in the rows, one line each
    tokens.py   the rows tokenised and labelled as TRL's SFTTrainer does it, outside the Trainer
    longrows.py the rows longer than SFT_MAX_LENGTH, counted once (SFT_LONG_ROWS: truncate, drop, error)
    cache.py    the training rows' tokens kept in OUTPUT/run/tokens/ for the ranks and a restart, and their key
    show.py     the first rows' tokens and which carry the loss, for `entrypoint.py data`

What SFT_DATASET says (its sources and their amounts) is the settings' (sft/settings/entries.py). The modules
here import `datasets` and TRL, which take seconds: only where they are used.
"""


class DataError(Exception):
    """The data cannot be trained on as it is: every problem, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))
