"""A model's own code (remote code): Python files of its repo or folder that its config.json or tokenizer_config.json
maps classes to (auto_map), which transformers runs only with trust_remote_code=True.

Found from the two JSON files alone, by transformers' own rules (AutoConfig, AutoModelForCausalLM and AutoTokenizer
in transformers 5.24): a class is needed from the model's code when its auto_map names it and transformers has none
for the model's type. Nothing of the model is imported to find it. Without SFT_TRUST_REMOTE_CODE the job refuses a
model that needs code before anything runs, and every library call passes trust_remote_code=False, so transformers
raises instead of asking on stdin (which the entrypoint closes as well). With it, every class the auto_map names
runs, needed or not: transformers prefers a model's own code to its own once the code is trusted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    """One class a model's files map to its own code."""

    auto: str  # AutoConfig, AutoModelForCausalLM, AutoTokenizer
    target: str  # the auto_map's value: module.Class (or "repo--module.Class")
    needed: bool  # transformers has no class of its own for the model

    def text(self) -> str:
        return f"{self.auto} -> {self.target}"


def found(model: str, revision: str | None = None) -> list[Code]:
    """Every class the model's config.json and tokenizer_config.json map to its own code (raises OSError, ValueError
    when config.json cannot be read: the model's other checks name that)."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config, _ = PretrainedConfig.get_config_dict(model, revision=revision)
    mapped = config.get("auto_map") or {}
    kind = config.get("model_type")
    codes = []
    if isinstance(mapped, dict):
        for auto, local in (("AutoConfig", CONFIG_MAPPING_NAMES), ("AutoModelForCausalLM",
                                                                     MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)):
            if mapped.get(auto):
                codes.append(Code(auto, _shown(mapped[auto]), kind not in local))
    return codes + _tokenizer(model, revision, kind)


def _tokenizer(model: str, revision: str | None, kind: str | None) -> list[Code]:
    from transformers.models.auto.tokenization_auto import (TOKENIZER_MAPPING_NAMES, get_tokenizer_config,
                                                            tokenizer_class_from_name)

    try:
        config = get_tokenizer_config(model, revision=revision)
    except (OSError, ValueError):
        return []  # no tokenizer_config.json: the tokenizer's own check names what is missing
    mapped = config.get("auto_map")
    target = mapped if isinstance(mapped, (list, tuple)) else (mapped or {}).get("AutoTokenizer") \
        if isinstance(mapped, dict) else None
    if not target:
        return []
    named = str(config.get("tokenizer_class") or "").removesuffix("Fast")
    local = kind in TOKENIZER_MAPPING_NAMES or bool(named) and any(
        tokenizer_class_from_name(n) is not None for n in (named, named + "Fast"))
    return [Code("AutoTokenizer", _shown(target), not local)]


def _shown(target) -> str:
    if isinstance(target, (list, tuple)):
        return ", ".join(str(t) for t in target if t)
    return str(target)


def problem(var: str, model: str, codes: list[Code], trusted: bool) -> str | None:
    """Why the model cannot load as the settings are (None: it can)."""
    needed = [c for c in codes if c.needed]
    if trusted or not needed:
        return None
    local = os.path.expanduser(model)
    where = local if os.path.isdir(local) else f"https://huggingface.co/{model}"
    return (f"{var}={model!r}: needs its own code to load ({'; '.join(c.text() for c in needed)}: the auto_map of its "
            "config files), which transformers does not have; the job never runs a model's code unasked: read it "
            f"({where}), then set SFT_TRUST_REMOTE_CODE=true to run it, or use a model transformers supports")
