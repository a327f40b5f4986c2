"""Model card metadata: ``POST /api/validate-yaml``.

``create_commit`` (and ``upload_folder``) call ``HfApi._validate_yaml`` whenever a commit adds the
top-level ``README.md``, before anything is uploaded; ``RepoCard.validate`` /
``RepoCard.push_to_hub`` call the same route (anonymously, with ``Accept: text/plain``). The request
is ``{"content": <README.md text>, "repoType": "model"|"dataset"|"space"}``. The answer:
  200  {"errors": [], "warnings": [{"message"}...]}   the client ``warnings.warn``s each warning
       (a card with no or empty front matter gets an "empty or missing yaml metadata" one, as on
       the Hub);
  400  {"error", "errors": [{"message"}...], "warnings": [...]}   ``_validate_yaml`` turns this into
       ``ValueError("Invalid metadata in README.md.\\n- <message>...")`` and the commit never starts;
       with ``Accept: text/plain`` the body is the messages as text (``RepoCard.validate`` raises
       ``ValueError(response.text)``).
The front matter is found as the client finds it (``repocard.REGEX_YAML_BLOCK``) and parsed with
PyYAML's ``safe_load`` (what the client itself uses; imported on first use, so the server still
starts without it, and then accepts any front matter with a warning that it was not checked).
Besides YAML syntax it checks a few types the Hub's card schema fixes (metadata is a mapping,
``model-index`` a list, ``license``/``library_name``/``pipeline_tag`` strings, ``tags``/``datasets``/
``language``/``metrics``/``base_model`` a string or a list of strings); it is not the Hub's full
schema (no license list, no check that ``base_model`` exists).
"""

from __future__ import annotations

import re

from .common import HubError, _header_value

# The client's own pattern for a card's front matter (huggingface_hub.repocard.REGEX_YAML_BLOCK).
YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
CARD_DOCS = {"model": "model-cards", "dataset": "datasets-cards", "space": "spaces-config-reference"}
# Fields of the Hub's card metadata schema whose type this server checks.
STRING_FIELDS = ("license", "library_name", "pipeline_tag")
STRINGS_FIELDS = ("tags", "datasets", "language", "metrics", "base_model")  # a string or a list of them
LIST_FIELDS = ("model-index",)


def validate_card_metadata(content: str, repo_type: str = "model") -> tuple[list[str], list[str]]:
    """(errors, warnings) for a README.md's YAML front matter, as /api/validate-yaml reports them."""
    match = YAML_BLOCK.search(content)
    missing = f"empty or missing yaml metadata in repo card (https://huggingface.co/docs/hub/{CARD_DOCS[repo_type]})"
    if match is None or not match.group(2).strip():
        return [], [missing]
    try:
        import yaml  # PyYAML: what huggingface_hub parses cards with; imported here to keep the server stdlib-only
    except ImportError:
        return [], ["hubserver: PyYAML is not installed, so the metadata was not checked"]
    try:
        data = yaml.safe_load(match.group(2))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if mark is None:
            return [f"Invalid YAML in the metadata: {err}"], []
        line = content[: match.end(1)].count("\n") + mark.line + 1  # a line number of README.md
        problem = " ".join(x for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x)
        return [f"Invalid YAML in the metadata, line {line} column {mark.column + 1}: {problem or err}"], []
    if data is None:
        return [], [missing]
    if not isinstance(data, dict):
        return [f"The metadata must be a YAML mapping (key: value), not a {type(data).__name__}"], []
    errors = []
    for key in STRING_FIELDS:
        if key in data and not isinstance(data[key], str):
            errors.append(f'"{key}" must be a string')
    for key in STRINGS_FIELDS:
        value = data.get(key)
        if key in data and not (isinstance(value, str)
                                or isinstance(value, list) and all(isinstance(v, str) for v in value)):
            errors.append(f'"{key}" must be a string or an array of strings')
    for key in LIST_FIELDS:
        if key in data and not isinstance(data[key], list):
            errors.append(f'"{key}" must be an array')
    return errors, []


class CardAPI:
    """The validate-yaml endpoint, mixed into the request handler."""

    def h_validate_yaml(self, m) -> None:
        body = self._json_body()
        self._principal()  # anonymous is fine (RepoCard.validate sends no token); a bad token is 401
        content, repo_type = body.get("content"), body.get("repoType") or "model"
        if not isinstance(content, str):
            raise HubError(400, '"content" must be a string')
        if repo_type not in ("model", "dataset", "space"):
            raise HubError(400, f'"repoType" must be one of [model, dataset, space], got {repo_type!r}')
        errors, warnings = validate_card_metadata(content, repo_type)
        as_text = "text/plain" in self.headers.get("Accept", "")
        if not errors:
            if as_text:
                return self._send(200, b"", content_type="text/plain; charset=utf-8")
            return self._json({"errors": [], "warnings": [{"message": w} for w in warnings]})
        summary = "Invalid metadata in README.md: " + "; ".join(errors)
        if as_text:
            text = "\n".join(errors).encode()
            return self._send(400, text, {"X-Error-Message": _header_value(summary)}, "text/plain; charset=utf-8")
        raise HubError(400, summary, extra={"errors": [{"message": e} for e in errors],
                                            "warnings": [{"message": w} for w in warnings]})
