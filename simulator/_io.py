"""Reading YAML/JSON files into typed specs, with one clear error for every way it can fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simulator.errors import ConfigError

T = TypeVar("T", bound=BaseModel)


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold a mapping."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {str(path)!r}: {exc.strerror}; check the path") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"{what} file {str(path)!r} is not valid {path.suffix.lstrip('.').upper() or 'YAML'} ({first}); fix its syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} file {str(path)!r} must hold a mapping of fields, not {type(data).__name__}")
    return data


def validation_message(exc: ValidationError, what: str) -> str:
    """One sentence from pydantic's first error, naming the field and the fix."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or what
    msg = err["msg"]
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    if err["type"] == "extra_forbidden":
        return f"{what} has an unknown field {loc!r}; remove it or check its spelling"
    if err["type"] == "missing":
        return f"{what} is missing the field {loc!r}; add it"
    return f"{what} field {loc!r}: {msg} (got {err.get('input')!r})"


def build(model: type[T], data: dict[str, Any], what: str) -> T:
    """Validate ``data`` into ``model``; a failure is one ConfigError sentence."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, what)) from None
