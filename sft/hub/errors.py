"""What can go wrong with the Hub, and how a failure is told: its HTTP status, whether a retry may help,
one line for the log, the token never in it."""

from __future__ import annotations

from .. import exitcodes

RETRY_STATUSES = (408, 429, 500, 502, 503, 504)  # the ones huggingface_hub's own http_backoff retries


class HubError(Exception):
    """The Hub cannot be used as asked; `exit_code` is one of exitcodes.HUB_* (or BAD_SETTINGS)."""

    def __init__(self, message: str, exit_code: int = exitcodes.HUB_AUTH):
        super().__init__(message)
        self.message, self.exit_code = message, exit_code


class TokenFound(Exception):
    """A file about to be uploaded contains the Hub token (the message names the file, never the token)."""


def http_status(e: BaseException) -> int | None:
    return getattr(getattr(e, "response", None), "status_code", None)


def retry_after(e: BaseException) -> float | None:
    """Seconds the Hub asked to wait (a 429's Retry-After), if it did."""
    headers = getattr(getattr(e, "response", None), "headers", None) or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def transient(e: BaseException | None) -> bool:
    """A failure a later try may not meet: no answer, 408, 429, 5xx; not a refusal nor a bad request."""
    seen = 0
    if isinstance(e, (ValueError, TypeError)) and http_status(e) is None:
        return False  # an argument the client itself refused (huggingface_hub's HFValidationError): no answer changes
    while e is not None and seen < 10:  # huggingface_hub wraps LFS failures: the HTTP error is a cause
        status = http_status(e)
        if status is not None:
            return status in RETRY_STATUSES
        e, seen = e.__cause__ or e.__context__, seen + 1
    return True


def short_error(e: BaseException) -> str:
    """The first line of an error, with its type: huggingface_hub's messages run to several lines."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "hf_***") if token else text
