"""Config dataclass fields that carry their own help text, and checks for their values.

Each field's help lives here, on the field, and nowhere else: the launchers' flags and the
docs' flag table (docs/flags.md) are generated from it.

    batch_size: int = setting(8, "B: unrolls per trainer step.")

`problem_setting` marks a setting that a Problem may choose for runs that leave it unset
(`Problem.learner_defaults`, `Problem.launch_defaults`): it holds None until the config's
`__post_init__` fills it, with the Problem's value or else the built-in one. So a config
built in Python resolves exactly as the command line does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


def setting(default: Any = dataclasses.MISSING, help_text: str = "", *,
            default_factory: Any = dataclasses.MISSING) -> Any:
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"help": help_text})


def problem_setting(builtin: Any, help_text: str) -> Any:
    """A setting that is None until resolved: the Problem's choice, else `builtin`."""
    return dataclasses.field(default=None, metadata={"help": help_text, "builtin": builtin})


def help_of(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


def builtin_of(field: dataclasses.Field) -> Any:
    """The default a user sees: the built-in one for a Problem's setting, else the field's."""
    if "builtin" in field.metadata:
        return field.metadata["builtin"]
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else None


def fill_problem_settings(config: Any, choices: Any) -> None:
    """Sets each unset `problem_setting` of `config` to the Problem's choice (a field of the
    same name in `choices` that is not None), else to its built-in default."""
    for field in dataclasses.fields(config):
        if "builtin" in field.metadata and getattr(config, field.name) is None:
            chosen = getattr(choices, field.name, None)
            setattr(config, field.name, field.metadata["builtin"] if chosen is None else chosen)


def check_range(name: str, value: float | None, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False) -> None:
    """Raises ValueError naming the setting when `value` is outside [low, high] (an open end
    with low_open or high_open)."""
    if value is None:
        return
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        bounds = (f"{'(' if low_open else '['}{'-inf' if low is None else low}, "
                  f"{'inf' if high is None else high}{')' if high_open else ']'}")
        raise ValueError(f"{name} must be in {bounds}, got {value}")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose from {', '.join(map(str, choices))}")
