"""Typed `key=value` overrides for config dataclasses, as given to --hparams.

    --hparams=learning_rate=3e-4,hidden_sizes=[128,128],use_lstm=true,scans=[scan_a,scan_b]

Values are parsed by the field's declared type: numbers, true/false, none for optional
fields, and lists in brackets whose items need no quotes (`[a,b]`; `["a","b"]` also works;
a single item may drop the brackets). The same text form travels to actors in RunInfo, so
no Python object ever crosses the network.
"""

from __future__ import annotations

import dataclasses
import difflib
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
        item_type = (typing.get_args(kind) or (str,))[0]
        try:
            return origin(_convert(name, item, item_type) for item in _list_items(value))
        except ValueError as e:
            raise ValueError(f"{e}; a list is written in brackets with its items separated by commas, such as "
                             f"{name}=[{_example(item_type)}]") from None
    raise ValueError(f"hparam {name}: fields of type {kind} cannot be set from text")


def _list_items(value: str) -> list[str]:
    """'[a, "b",c]' -> ['a', 'b', 'c']; '(1,2)' and a lone item '64' work too; '[]' is empty."""
    text = value.strip()
    if text[:1] in "[(" and text[-1:] in "])":
        text = text[1:-1].strip()
    if not text:
        return []
    items = [item.strip() for item in text.split(",")]
    return [item[1:-1] if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"" else item for item in items]


def _example(item_type: Any) -> str:
    return {int: "64,64", float: "0.5,0.25", bool: "true,false"}.get(item_type, "a,b")


def apply_hparams(config: Any, overrides: Mapping[str, str]) -> Any:
    """A copy of dataclass `config` with `overrides` applied; unknown keys are an error."""
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        guesses = {name: difflib.get_close_matches(name, fields, n=1) for name in unknown}
        hints = "".join(f"; did you mean {guess[0]!r} for {name!r}?" for name, guess in guesses.items() if guess)
        raise ValueError(f"unknown hparams {unknown} for {type(config).__name__}{hints} (known: {sorted(fields)})")
    return dataclasses.replace(config, **{k: _convert(k, v, hints[k]) for k, v in overrides.items()})


def format_hparams(overrides: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items())
