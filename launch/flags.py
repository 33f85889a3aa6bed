"""absl flags generated from config dataclasses, and the way back to a command line.

Each config field becomes a flag of the same name, with the help text the field carries
(fleetrl.common.settings). A Problem's settings (`problem_setting`) are flags without a
default: left out, the config takes the Problem's choice when it is built. `to_argv`
renders a config as flags, so `launch.local` starts the learner and actors with exactly
the config it was given. Only the entry points in launch/ use this module.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import app, flags

from fleetrl.common.settings import builtin_of, help_of
from fleetrl.launch.configs import FleetConfig
from fleetrl.learner.config import LearnerConfig
from fleetrl.problems.hparams import format_hparams, parse_hparams
from fleetrl.problems.registry import UnknownProblemError, problem_class


def field_help(config_cls: type, name: str) -> str:
    """A field's help, from the nearest class in the MRO that gives one (a Problem's config
    may change a field's default and keep its base class's help)."""
    for cls in config_cls.__mro__:
        field = getattr(cls, "__dataclass_fields__", {}).get(name)
        if field is not None and help_of(field):
            return help_of(field)
    return ""


def _listed_in_help(name: str) -> None:
    """absl's --help lists the key flags of the program's main module, by its file name. The
    flags are defined here, not there, and a console script's main module is a wrapper: so
    each flag is registered for the program being run, whichever it is."""
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def define_flags(config_cls: type, skip: tuple[str, ...] = ()) -> None:
    """Defines one absl flag per field of `config_cls` (except `skip` and flags already defined)."""
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        name = field.name
        if name in skip or name in flags.FLAGS:
            continue
        kind, text = hints[name], field_help(config_cls, name)
        if "builtin" in field.metadata:
            text += f" Default: {builtin_of(field)!r}, or the Problem's own choice."
        default = None if "builtin" in field.metadata else builtin_of(field)
        if kind in (bool, bool | None):
            flags.DEFINE_boolean(name, default, text)
        elif kind in (int, int | None):
            flags.DEFINE_integer(name, default, text)
        elif kind in (float, float | None):
            flags.DEFINE_float(name, default, text)
        elif kind in (str, str | None):
            flags.DEFINE_string(name, default, text)
        elif kind == dict[str, str]:
            flags.DEFINE_string(name, format_hparams(default), text)
        else:
            raise TypeError(f"{config_cls.__name__}.{name}: no flag type for {kind}")
        _listed_in_help(name)


def from_flags(config_cls: type, **overrides: Any) -> Any:
    """A `config_cls` from the parsed flags; `overrides` (other fields, nested configs) win."""
    hints = typing.get_type_hints(config_cls)
    values = {}
    for field in dataclasses.fields(config_cls):
        if field.name in overrides or field.name not in flags.FLAGS:
            continue
        value = flags.FLAGS[field.name].value
        if hints[field.name] == dict[str, str]:
            value = parse_hparams(value)
        values[field.name] = value
    return config_cls(**values, **overrides)


def to_argv(config: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The command-line flags that reproduce `config`."""
    argv = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in skip or value is None:
            continue
        if isinstance(value, dict):
            value = format_hparams(value)
        elif isinstance(value, bool):
            value = str(value).lower()
        argv.append(f"--{field.name}={value}")
    return argv


_problem_flags: list[str] = []


def define_problem_flags(argv: Sequence[str]) -> None:
    """Makes each field of the chosen Problem's config a flag of its own, so that
    `--suite=libero_10` means `--hparams=suite=libero_10`. Call it before absl parses
    `argv`. Fields whose name is already a flag (batch_size, seed, ...) stay hparams only,
    and an unknown Problem is left for the config to report."""
    name = LearnerConfig.problem
    for i, arg in enumerate(argv):
        if arg.startswith("--problem="):
            name = arg.split("=", 1)[1]
        elif arg == "--problem" and i + 1 < len(argv):
            name = argv[i + 1]
    try:
        config_cls = problem_class(name).Config
    except UnknownProblemError:
        return
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        if field.name in flags.FLAGS:
            continue
        text = field_help(config_cls, field.name)
        text = (f"{text + ' ' if text else ''}Problem hparam, default {builtin_of(field)!r}; the same as "
                f"--hparams={field.name}=VALUE.")
        # Booleans as absl's, so that --flag and --noflag work; the rest as text the config parses.
        define = flags.DEFINE_boolean if hints[field.name] is bool else flags.DEFINE_string
        define(field.name, None, text)
        _listed_in_help(field.name)
        _problem_flags.append(field.name)


def problem_hparams_from_flags(hparams: Mapping[str, str]) -> dict[str, str]:
    """`hparams` with the Problem's own flags that the command line set (those win)."""
    given = {name: flags.FLAGS[name].value for name in _problem_flags if flags.FLAGS[name].present}
    return {**hparams, **{k: str(v).lower() if isinstance(v, bool) else v for k, v in given.items()}}


def timestamped_logdir(problem: str) -> str:
    """runs/<problem>-<time>, the launchers' default logdir."""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in problem.rsplit(":", 1)[-1]).lower()
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_main(main: Callable[[list[str]], int], doc: str | None, problem_flags: bool = False) -> None:
    """Runs an entry point's `main` under absl and exits with its code. `doc` is what --help
    says first (a console script's own main module is a wrapper without one); with
    `problem_flags` the chosen Problem's config fields are flags too."""
    main_module = sys.modules["__main__"]
    main_module.__doc__ = main_module.__doc__ or doc
    if problem_flags:
        define_problem_flags(sys.argv)
    app.run(lambda argv: sys.exit(main(argv)))


def learner_config_from_flags(**overrides: Any) -> LearnerConfig:
    """The LearnerConfig of the command line, with the Problem's own flags merged into its
    hparams; settings left unset take the Problem's choice as the config is built."""
    hparams = problem_hparams_from_flags(parse_hparams(flags.FLAGS.hparams))
    return from_flags(LearnerConfig, hparams=hparams, **overrides)


def launcher_main(config_cls: type, bind: str, launch: Callable[[Any], int]) -> int:
    """`main` of a launcher that runs a learner and a fleet (launch.local, launch.ray): its
    config from the flags (the learner bound to `bind`, logging to runs/<problem>-<time>
    unless --logdir says otherwise), then `launch` of it. A bad flag or hparam, a bad
    resource request or an unknown Problem exits 2 with one line."""
    try:
        learner = learner_config_from_flags(bind=bind)
        if flags.FLAGS["logdir"].using_default_value:
            learner = dataclasses.replace(learner, logdir=timestamped_logdir(learner.problem))
        config = from_flags(config_cls, learner=learner, fleet=from_flags(FleetConfig))
    except ValueError as e:
        print(f"fleetrl: {e}", file=sys.stderr)
        return 2
    return launch(config)
