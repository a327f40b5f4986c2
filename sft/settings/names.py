"""What the Hub takes as a repo's name, by huggingface_hub's own validator (validate_repo_id: letters, digits, - _ .,
at most 96 characters, "namespace/name" or "name", no "--" or "..", not starting or ending with - or ., not ending
in .git), so a name the Hub would refuse is a setting's problem at the start, not a failed call after it."""

from __future__ import annotations


def hub_name_problem(value: str) -> str | None:
    """Why the Hub would not take `value` as a repo's name (huggingface_hub's words, trimmed); None: it would."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError as e:
        return str(e).split(": '")[0].rstrip(".")  # its message ends by repeating the value, which ours shows
    return None


def not_a_name(value: str, why: str) -> str:
    """Why a value is neither a path nor a Hub name: `why`, with the Hub's reason where it was written as one
    (owner/name) and breaks one of its rules."""
    reason = hub_name_problem(value) if "/" in value else None
    return why + (f" ({reason})" if reason else "")


def is_hub_name(value: str) -> bool:
    return hub_name_problem(value) is None
