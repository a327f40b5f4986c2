"""Full fp32 weights from a DeepSpeed checkpoint, through DeepSpeed's own zero_to_fp32."""

from __future__ import annotations

import shutil
from pathlib import Path

# The Trainer saves these beside the shards; with them the export loads with from_pretrained.
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja")


def export(checkpoint: str | Path, out: str | Path) -> Path:
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    checkpoint, out = Path(checkpoint), Path(out)
    convert_zero_checkpoint_to_fp32_state_dict(str(checkpoint), str(out), safe_serialization=True)
    for name in MODEL_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, out / name)
    return out
