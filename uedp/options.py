"""CLI options derived from the typed configuration: one ``--flag`` per field of the settings models,
its help and default taken from the field (defined once, in the model), plus ``--config file.yaml`` and
``--set key=value`` overrides that reach every parameter.

Precedence, lowest first: the models' defaults, the ``--config`` file, explicit flags, ``--set``.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from pydantic import BaseModel

from uedp.errors import UedpError

CONFIG_HELP = ("YAML file of settings (flat `key: value`, or the `params:` block of a logged resolved_config.json's "
               "config); flags and --set override it.")
SET_HELP = "Override any setting: --set q_entity=0.1 (repeatable; values are YAML: 0.1, true, \\[a, b])."


def _cli_type(annotation: Any) -> Any:
    """The type typer parses a field as: numbers and flags as themselves, everything else as text."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _cli_type(args[0])
    if annotation in (int, float, bool):
        return annotation
    return str


def _describe_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return " ".join(_describe_default(v) for v in value) if value and isinstance(value[0], list) else \
            (",".join(map(str, value)) or "none")
    return str(value)


def default_of(model: type[BaseModel], name: str) -> str:
    """``[default: ...]`` for a field, as derived options show it (escaped for rich's markup)."""
    return f"\\[default: {_describe_default(model.model_fields[name].get_default(call_default_factory=True))}]"


def derived_parameters(models: list[type[BaseModel]], skip: set[str] = frozenset(),  # type: ignore[assignment]
                       aliases: dict[str, list[str]] | None = None) -> list[inspect.Parameter]:
    """One keyword parameter per field (first model wins on a shared name), each an option whose
    absence means "the configuration's default"."""
    seen: set[str] = set()
    out = []
    for model in models:
        for name, info in model.model_fields.items():
            if name in skip or name in seen:
                continue
            seen.add(name)
            flags = [f"--{name.replace('_', '-')}", *(aliases or {}).get(name, [])]
            kind = _cli_type(info.annotation)
            if kind is bool:
                flags = [f"--{name.replace('_', '-')}/--no-{name.replace('_', '-')}"]
            listed = typing.get_origin(info.annotation) is list
            help_text = (info.description or name.replace("_", " ")).rstrip(".")
            help_text = f"{help_text}{' (comma-separated)' if listed else ''} {default_of(model, name)}"
            option = typer.Option(None, *flags, help=help_text, show_default=False)
            out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                         annotation=Optional[kind]))
    return out


def with_options(extra: list[inspect.Parameter]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command ``def command(explicit..., **derived)`` the derived options in its signature."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        explicit = [p for p in signature.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
        hints = typing.get_type_hints(command)
        explicit = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in explicit]

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return command(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*explicit, *extra])  # type: ignore[attr-defined]
        del wrapper.__wrapped__  # typer must read the signature above, not the command's own
        return wrapper
    return decorate


def read_config_file(path: Path | None) -> dict[str, Any]:
    """A YAML (or JSON) mapping of settings; a nested ``params`` (or ``config.params``) block is flattened."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UedpError(f"--config {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UedpError(f"--config {path}: expected a mapping of settings, got {type(data).__name__}")
    if isinstance(data.get("config"), dict):  # a logged resolved_config.json
        data = data["config"]
    return {**{k: v for k, v in data.items() if k != "params"}, **(data.get("params") or {})}


def parse_sets(pairs: list[str] | None) -> dict[str, Any]:
    """``["q_entity=0.1", "categories=[PERSON, LOC]"]`` -> values parsed as YAML; ``params.`` and dashes allowed."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UedpError(f"--set {pair!r}: expected key=value")
        key = key.strip().removeprefix("params.").replace("-", "_")
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            out[key] = raw
    return out


def merged(config_file: Path | None, options: dict[str, Any], sets: list[str] | None,
           listed: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    """Settings in order of precedence; options left unset (None) do not override; ``listed`` options
    arrive comma-separated and become lists."""
    given = {k: ([item.strip() for item in v.split(",") if item.strip()] if k in listed and isinstance(v, str) else v)
             for k, v in options.items() if v is not None}
    return {**read_config_file(config_file), **given, **parse_sets(sets)}


def list_fields(*models: type[BaseModel]) -> set[str]:
    return {name for model in models for name, info in model.model_fields.items()
            if typing.get_origin(info.annotation) is list}
