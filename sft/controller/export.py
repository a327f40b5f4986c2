"""Full fp32 weights from a DeepSpeed checkpoint, through DeepSpeed's own zero_to_fp32.

DeepSpeed's converter writes a bare state dict and refuses tied weights (Qwen3's small models tie
the embedding to the output layer) in safetensors; loading its state dict into the model class and
saving with save_pretrained gives a normal model folder that from_pretrained loads.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..checkpoints import problem
from ..settings.fields import TRUE

# The Trainer saves these beside the shards; copied so the export is a complete model folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


class NotACheckpoint(Exception):
    """The folder is not a checkpoint the job wrote (the message says what is missing)."""


def export(checkpoint: str | Path, out: str | Path) -> Path:
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    checkpoint, out = Path(checkpoint), Path(out)
    missing = [name for name in ("latest", "config.json") if not (checkpoint / name).is_file()]
    if missing:
        raise NotACheckpoint(f"{checkpoint} is not a checkpoint of this job (no {' or '.join(missing)}): give an "
                             "OUTPUT/checkpoint-N folder the Trainer and DeepSpeed wrote")
    if (why := problem(checkpoint)) is not None:  # DeepSpeed's converter would fail on it with a traceback
        raise NotACheckpoint(f"{checkpoint} is not complete ({why}): export a complete one (`status` names the newest "
                             "on disk)")
    state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    trust = os.environ.get("SFT_TRUST_REMOTE_CODE", "").strip().lower() in TRUE  # as the run that wrote it
    try:
        config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=trust)
    except ValueError as e:  # the model's own code, not trusted: refused, never asked about
        raise NotACheckpoint(f"{checkpoint}: its model needs its own code ({str(e).splitlines()[0]}): set "
                             "SFT_TRUST_REMOTE_CODE=true, as the run had it, to run it") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    untied = [k for k in missing if model.get_parameter(k).is_meta]
    if untied or unexpected:
        raise RuntimeError(f"{checkpoint}: weights do not match the model: missing {untied}, unexpected {unexpected}")
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out / name)
    return out
