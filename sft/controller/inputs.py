"""What the decision is a function of, read once: the model's shape, the user's DeepSpeed file, and the
record of the checkpoint this start resumes from (the machine is measured in machine.py).

Also the inputs' checks that need a read (a model's files, DeepSpeed's config model, TRL's SFTConfig): each is a
function Settings -> problems, one line each; `problems` runs a list of them, so they report together with the
settings' own and the ranks' (prepare.checked), before anything is started or written.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import checkpoints, exitcodes, nodes
from ..handoff import read_json
from ..settings.entries import looks_local
from ..planner.inputs import CannotRun, DataFacts, Inputs, Machine, Ranks
from ..planner.shape import ModelShape
from ..settings import Settings, is_hub_name
from . import revisions
from .trainerargs import trainer_args

Finder = Callable[[Settings], list[str]]
COPY_TOKENIZER = ("copy the tokenizer files of the model it came from, or save them there with its tokenizer's "
                  "save_pretrained")


def read(s: Settings, machine: Machine, ranks: Ranks, resume: Path | None = None, data: DataFacts | None = None
         ) -> Inputs:
    """The decision's inputs (raises CannotRun when the model's config cannot be read)."""
    record = checkpoints.recorded(resume) if resume is not None else None
    try:
        revision = model_revision(s)
    except revisions.RevisionError as e:
        raise CannotRun(f"SFT_MODEL: {e}", exitcodes.BAD_SETTINGS) from None
    return Inputs(settings=s, machine=machine, shape=shape_of(s.model, revision, s.trust_remote_code), ranks=ranks,
                  record=record, user_config=s.user_ds_config, data=data, model_revision=revision,
                  remote_code=tuple(c.text() for c in _remote_code(s.model, revision)))


def model_revision(s: Settings) -> str | None:
    """SFT_MODEL_REVISION (unset: main) as a commit; None for a local folder (raises RevisionError)."""
    return None if looks_local(s.model) else _commit(s.model, s.model_revision)


@functools.lru_cache(maxsize=8)  # the data step and the decision's inputs ask once each
def _commit(model: str, revision: str | None) -> str | None:
    return revisions.resolve(model, "model", revision)


def shape_of(model: str, revision: str | None = None, trust: bool = False) -> ModelShape:
    """The model's shape from its config.json, or a one-line reason it cannot be read."""
    try:
        return model_shape(model, revision, trust)
    except NotACausalLM as e:
        raise CannotRun(f"SFT_MODEL={model!r}: its config.json is a {e}, for which transformers has no causal "
                        "language model (AutoModelForCausalLM): this job trains text-generation models, not "
                        "vision-language, encoder or other models", exitcodes.BAD_SETTINGS) from None
    except Exception as e:  # noqa: BLE001 - not found, offline and not cached, not a model config, or the model's
        # own code (with SFT_TRUST_REMOTE_CODE) failing: one line naming it, not the library's traceback
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = ("; set SFT_TRUST_REMOTE_CODE=true only after reading its code" if "trust_remote_code" in str(e)
                else "")
        raise CannotRun(f"SFT_MODEL={model!r}: cannot read its config.json ({why}): {_config_fix(model)}{hint}",
                        exitcodes.BAD_SETTINGS) from None


def _config_fix(model: str) -> str:
    """What to do about a config.json transformers cannot read: a local one torn, or of a model_type it lacks."""
    from transformers import CONFIG_MAPPING, __version__

    config = read_json(Path(os.path.expanduser(model)) / "config.json") if looks_local(model) else {}
    if not isinstance(config, dict):
        return "copy it again from the model it came from"
    kind = config.get("model_type")
    if not looks_local(model) or config.get("auto_map") or kind in CONFIG_MAPPING:
        return "check the name or path, the network, and HF_HUB_OFFLINE"
    if not kind:
        return ('it names no model_type (the architecture, such as "llama"): add it, or save the config with '
                "transformers' save_pretrained")
    return (f"transformers {__version__} knows no model_type {kind!r}: a misspelt model_type, or a model newer than "
            "this transformers (a model with its own code names it in auto_map, and runs with SFT_TRUST_REMOTE_CODE)")


class NotACausalLM(ValueError):
    """A config transformers reads, of a model it has no AutoModelForCausalLM class for (vision-language, encoder)."""


def model_shape(model: str, revision: str | None = None, trust: bool = False) -> ModelShape:
    """Read a model's config.json (folder or Hub name) and count its parameters on the meta device. `trust`:
    SFT_TRUST_REMOTE_CODE (False: transformers refuses a model's own code instead of asking; remotecode.py)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cfg = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust)
    own_code = getattr(cfg, "auto_map", None) or {}  # a model's own classes (SFT_TRUST_REMOTE_CODE)
    if type(cfg) not in MODEL_FOR_CAUSAL_LM_MAPPING and "AutoModelForCausalLM" not in own_code:
        raise NotACausalLM(type(cfg).__name__)
    with torch.device("meta"):  # shapes only: no memory, no weights downloaded
        net = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust)
    named = list(net.named_parameters())  # tied weights appear once
    text = cfg.get_text_config()
    heads = text.num_attention_heads
    return ModelShape(
        name=model,
        total_params=sum(p.numel() for _, p in named),
        largest_layer_params=max(p.numel() for _, p in named),
        hidden_size=text.hidden_size,
        intermediate_size=_intermediate_size(text),
        num_layers=text.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab_size=text.vocab_size,
        qk_norm=any(n.endswith("q_norm.weight") for n, _ in named),
        attentions=attentions_of(type(net)),
        model_class=type(net).__name__,
    )


# transformers' flags on a model class for each attention kernel the job can ask for (PreTrainedModel's own default
# is False for each); eager is every model's own code
KERNEL_FLAGS = {"flash_attention_4": "_supports_flash_attn", "flex_attention": "_supports_flex_attn",
                "sdpa": "_supports_sdpa"}


def attentions_of(cls: type) -> tuple[str, ...]:
    """The attention kernels a transformers model class runs, as transformers checks them when the model loads."""
    return tuple(k for k, flag in KERNEL_FLAGS.items() if getattr(cls, flag, False)) + ("eager",)


def _intermediate_size(text) -> int:
    """The MLP's width: `intermediate_size` in most configs; GPT-2's and GPT-J's `n_inner` and OPT's `ffn_dim`
    where they name it so (GPT-2's None, and configs without any, mean the classic 4 x hidden_size)."""
    for name in ("intermediate_size", "n_inner", "ffn_dim"):
        if isinstance(value := getattr(text, name, None), int):
            return value
    return 4 * text.hidden_size


def problems(s: Settings, finders: Sequence[Finder]) -> list[str]:
    """Every problem the finders see, in their order."""
    return [problem for find in finders for problem in find(s)]


# --- the finders


def ds_file(s: Settings) -> list[str]:
    """SFT_DS_CONFIG as DeepSpeed's config model reads it (the settings checked that it is a JSON object)."""
    from .dsfile import problems as refused

    if s.ds_config is None:
        return []
    try:
        config = s.user_ds_config
    except (OSError, ValueError):
        return []  # the settings named it already
    if not isinstance(config, dict) or "zero_optimization" not in config:
        return []  # the settings named it already
    # the batch is decided later (SFT_MICRO_BATCH may be unset); any whole number checks the file's own keys
    return [f"SFT_DS_CONFIG={s.ds_config!r}: {why}" for why in refused(config, s.micro_batch or 1)]


def model_code(s: Settings) -> list[str]:
    """A model that needs its own code to load is refused unless SFT_TRUST_REMOTE_CODE says to run it."""
    from . import remotecode

    if _local_folder(s.model) is None and (looks_local(s.model) or not is_hub_name(s.model)):
        return []
    why = remotecode.problem("SFT_MODEL", s.model, _remote_code(s.model), s.trust_remote_code)
    return [why] if why else []


def _remote_code(model: str, revision: str | None = None) -> list:
    from . import remotecode

    try:
        return remotecode.found(model, revision)
    except Exception:  # noqa: BLE001 - config.json unreadable: model_config names why
        return []


def model_config(s: Settings) -> list[str]:
    """The model's config.json can be read (a folder's, or the Hub's or its cache's for a name)."""
    if _local_folder(s.model) is None and (looks_local(s.model) or not is_hub_name(s.model)):
        return []  # the settings named the missing folder, or a name the Hub cannot have
    if model_code(s):
        return []  # named there: nothing of the model is loaded without its consent
    try:
        shape_of(s.model, trust=s.trust_remote_code)
    except CannotRun as e:
        return [str(e)]
    return []


def folder_config(s: Settings) -> list[str]:
    """model_config of a model folder alone: a Hub model's is read with its tokenizer by the data step, which names
    it with the data's problems."""
    return model_config(s) if _local_folder(s.model) is not None else []


def model_weights(s: Settings) -> list[str]:
    """A model folder holds its weights, and every shard its index names: without them every rank fails as it
    loads the model, after the data is read and the ranks started (a copy that stopped part way, say)."""
    import json

    # the files transformers' from_pretrained looks for in a folder, an index of shards or one file
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    folder = _local_folder(s.model)
    if folder is None:
        return []
    for name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME):
        if (folder / name).is_file():
            try:
                shards = sorted(set(json.loads((folder / name).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                return [f"SFT_MODEL={s.model!r}: its {name} cannot be read ({_first_line(e)}): copy it again"]
            if missing := [f for f in shards if not (folder / f).is_file()]:
                return [f"SFT_MODEL={s.model!r}: {len(missing)} of the {len(shards)} weight files its {name} names "
                        f"are not in the folder ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
                        "copy the model's files again, all of them"]
            return []
    if any((folder / name).is_file() for name in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME)):
        return []
    held = ", ".join(sorted(p.name for p in folder.iterdir())[:12])
    return [f"SFT_MODEL={s.model!r}: no weights in the folder (model.safetensors, pytorch_model.bin, or an index "
            f"of their shards; it holds: {held}): copy the model's weight files, or save the model with its "
            "save_pretrained"]


def model_tokenizer(s: Settings) -> list[str]:
    """A model folder holds a tokenizer: without one AutoTokenizer gives an empty one, and every rank fails
    long after the start (models named on the Hub come with theirs)."""
    folder = _local_folder(s.model)
    if folder is None:
        return []
    whole = folder / "tokenizer.json"
    if model_code(s) or read_json(folder / "config.json") is None:
        return []  # named there, or by model_config: AutoTokenizer reads config.json first, and failed on it
    try:
        tokenizer = _tokenizer(folder, s.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any failure to load is the problem to report
        held = ", ".join(sorted(p.name for p in folder.iterdir()))
        why = (f"its tokenizer cannot be loaded ({_first_line(e)})" if whole.is_file() else
               f"no tokenizer.json, and AutoTokenizer finds no other tokenizer files (the folder holds: {held})")
        return [f"SFT_MODEL={s.model!r}: {why}: {COPY_TOKENIZER}"]
    names = dict(getattr(type(tokenizer), "vocab_files_names", {}))
    names.pop("tokenizer_file", None)
    parts = sorted(set(names.values()))
    if whole.is_file() or (parts and all((folder / n).is_file() for n in parts)):
        return []
    alternative = f", or {' and '.join(parts)} ({type(tokenizer).__name__})" if parts else ""
    return [f"SFT_MODEL={s.model!r}: no tokenizer in the folder (missing tokenizer.json{alternative}): "
            f"{COPY_TOKENIZER}"]


def hub_token(s: Settings) -> list[str]:
    """SFT_HUB_REPO needs a token on node 0 (the one that uploads)."""
    from .uploads import token

    if s.hub_repo is None or token() or not nodes.from_env(os.environ).leads:
        return []
    return [f"SFT_HUB_REPO={s.hub_repo!r} needs HF_TOKEN: a Hugging Face token with write access "
            "(https://huggingface.co/settings/tokens)"]


def hub_online(s: Settings) -> list[str]:
    """SFT_HUB_REPO needs the Hub, which HF_HUB_OFFLINE forbids (read as huggingface_hub reads it)."""
    from huggingface_hub import constants

    if s.hub_repo is None or not constants.HF_HUB_OFFLINE or not nodes.from_env(os.environ).leads:
        return []
    return [f"SFT_HUB_REPO={s.hub_repo!r} but HF_HUB_OFFLINE=1 forbids the Hub: unset one of them"]


# What each command checks besides the settings: `plan` and `doctor` decide without a model's files.
ALWAYS: tuple[Finder, ...] = (trainer_args,)
DECIDING: tuple[Finder, ...] = (*ALWAYS, ds_file)
# `data` tokenises with the model's tokenizer: a folder without one gave an empty tokenizer, whose renderings of every
# row were blamed on the chat template
DATA: tuple[Finder, ...] = (*ALWAYS, model_code, folder_config, model_tokenizer)
# A missing chat template is the data step's to find (controller/data.py): only conversations need one, and
# SFT_CHAT_TEMPLATE may bring it.
CONFIG: tuple[Finder, ...] = (*DECIDING, model_code, model_config, model_weights, model_tokenizer)
JOB: tuple[Finder, ...] = (*CONFIG, hub_token, hub_online)


def _local_folder(model: str) -> Path | None:
    """The model's folder when it is local and a model folder (config.json), else None."""
    if not looks_local(model):
        return None
    path = Path(os.path.expanduser(model))
    return path if os.path.isfile(path / "config.json") else None  # os.path: no raise on a name too long


def _tokenizer(folder: Path, trust: bool = False):
    """The folder's tokenizer as AutoTokenizer loads it, loaded once while the folder's files stay the same."""
    stamp = tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir() if p.is_file()))
    return _load_tokenizer(folder, stamp, trust)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(folder: Path, stamp: tuple, trust: bool):
    """AutoTokenizer's load, without the warning it gives where AutoConfig knows no model_type and it reads the
    config as the base class ("... to instantiate a model of type ``"): model_config says that model_type itself."""
    import logging

    from transformers import AutoTokenizer

    logger = logging.getLogger("transformers.configuration_utils")
    logger.addFilter(_not_the_base_config_warning)
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
    finally:
        logger.removeFilter(_not_the_base_config_warning)


def _not_the_base_config_warning(record) -> bool:
    text = str(record.msg)
    return not (text.startswith("You are using a model of type") and "to instantiate a model of type ``" in text)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
