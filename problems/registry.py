"""Finds a Problem class by registered name or by `module:Class` import path.

Built-ins are listed by import path, so naming one imports only that Problem's module
(LIBERO's, say, is heavy). Users never edit this file: they pass
`--problem=my_pkg.my_module:MyProblem`, or call `register("name", "pkg.mod:Cls")`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from fleetrl.problems.base import Problem

BUILTIN: dict[str, str] = {
    "cartpole": "fleetrl.problems.cartpole:CartPoleProblem",
    "cartpole_lstm": "fleetrl.problems.cartpole:CartPoleLSTMProblem",
    "continuous_control": "fleetrl.problems.continuous_control:ContinuousControlProblem",
    "pendulum": "fleetrl.problems.continuous_control:PendulumProblem",
    "grid_nav": "fleetrl.problems.grid_nav:GridNavProblem",
    "gym": "fleetrl.problems.gym_env:GymProblem",
    "gym_cards/numberline": "fleetrl.problems.gym_cards:NumberLineProblem",
    "gym_cards/ezpoints": "fleetrl.problems.gym_cards:EZPointsProblem",
    "gym_cards/points24": "fleetrl.problems.gym_cards:Points24Problem",
    "gym_cards/blackjack": "fleetrl.problems.gym_cards:BlackjackProblem",
    "gym_cards/numberline_vlm": "fleetrl.problems.gym_cards_vlm:NumberLineVLMProblem",
    "gym_cards/ezpoints_vlm": "fleetrl.problems.gym_cards_vlm:EZPointsVLMProblem",
    "gym_cards/points24_vlm": "fleetrl.problems.gym_cards_vlm:Points24VLMProblem",
    "gym_cards/blackjack_vlm": "fleetrl.problems.gym_cards_vlm:BlackjackVLMProblem",
    "r2r": "fleetrl.problems.r2r:R2RProblem",
    "libero": "fleetrl.problems.libero:LiberoProblem",
    "libero_flow_vla": "fleetrl.problems.libero_flow_vla:LiberoFlowVLAProblem",
    "point_reach": "fleetrl.problems.point_reach:PointReachProblem",
}
_registry: dict[str, str] = dict(BUILTIN)


class UnknownProblemError(ValueError):
    pass


def register(name: str, import_path: str) -> None:
    _registry[name] = import_path


def registered_names() -> list[str]:
    return sorted(_registry)


def problem_class(name: str) -> type[Problem]:
    """The Problem class for a registered name or a `module:Class` path."""
    path = _registry.get(name, name)
    if ":" not in path:
        raise UnknownProblemError(
            f"unknown problem {name!r}; registered problems: {', '.join(registered_names())}; "
            f"or pass an import path such as my_pkg.my_module:MyProblem")
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownProblemError(f"problem {name!r}: cannot import module {module_name!r}: {e}") from e
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Problem)):
        raise UnknownProblemError(f"problem {name!r}: {module_name} has no Problem subclass named {class_name!r}")
    return cls


def trusted_problem_class(name: str, source: str, flag: str = "--problem") -> type[Problem]:
    """The Problem class for a name read from data (a learner's RunInfo, a checkpoint), which
    may come from someone else: a registered name is imported, an import path is not (it
    would run that module's code). The user names their own on the command line (`flag`)."""
    if name not in _registry:
        raise UnknownProblemError(
            f"{source} names problem {name!r}, which is not a registered Problem; fleetrl imports no module that "
            f"data names. If you trust it, pass {flag}={name}")
    return problem_class(name)


def names_a_base_of(cls: type, name: str) -> bool:
    """Whether `name` (registered, or an import path) is `cls` or one of its bases, found
    without importing `name`'s module."""
    path = _registry.get(name, name)
    return any(f"{c.__module__}:{c.__qualname__}" == path for c in cls.__mro__)


def load_problem(name: str, hparams: Mapping[str, str] | None = None) -> Problem:
    return problem_class(name).from_hparams(hparams or {})
