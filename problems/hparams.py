"""Typed `key=value` overrides for config dataclasses, as given to --hparams.

    --hparams=learning_rate=3e-4,hidden_sizes=[128,128],use_lstm=true

Values are parsed by the field's declared type. The same text form travels to actors in
RunInfo, so no Python object ever crosses the network.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from typing import Any

_SPLIT = re.compile(r",(?![^\[\(]*[\]\)])")  # commas outside brackets


def parse_hparams(text: str) -> dict[str, str]:
    """'a=1,b=[2,3]' -> {'a': '1', 'b': '[2,3]'}."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in _SPLIT.split(text or ""))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--hparams item {item!r} is not of the form key=value")
        out[key.strip()] = value.strip()
    return out


def _convert(name: str, value: str, kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin is typing.Union or type(kind).__name__ == "UnionType":
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if value.lower() in ("none", "null", ""):
            return None
        return _convert(name, value, args[0])
    if kind is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"hparam {name}={value!r}: expected true or false")
    if kind in (int, float, str):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"hparam {name}={value!r}: expected {kind.__name__}") from None
    if origin in (tuple, list):
        try:
            items = json.loads(value.replace("(", "[").replace(")", "]"))
        except json.JSONDecodeError:
            raise ValueError(f"hparam {name}={value!r}: expected a list such as [64,64]") from None
        item_type = (typing.get_args(kind) or (Any,))[0]
        items = [_convert(name, json.dumps(i) if not isinstance(i, str) else i, item_type)
                 if item_type is not Any else i for i in items]
        return origin(items)
    raise ValueError(f"hparam {name}: fields of type {kind} cannot be set from text")


def apply_hparams(config: Any, overrides: Mapping[str, str]) -> Any:
    """A copy of dataclass `config` with `overrides` applied; unknown keys are an error."""
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown hparams {unknown} for {type(config).__name__}; known: {sorted(fields)}")
    return dataclasses.replace(config, **{k: _convert(k, v, hints[k]) for k, v in overrides.items()})


def format_hparams(overrides: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items())
