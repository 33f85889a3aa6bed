"""Gymnasium env ids read from a config, which may come from data (a learner's hparams, a
checkpoint's): an id of the form `module:Env-v0` makes `gym.make` import `module`, so such an
id is taken only when that module is imported already (by the user's own code)."""

from __future__ import annotations

import sys


def check_env_id(env_id: str, setting: str = "env_id") -> None:
    """Raises ValueError for an id whose module prefix is not imported yet."""
    module, colon, _ = env_id.partition(":")
    if colon and module not in sys.modules:
        raise ValueError(f"{setting}={env_id!r} would make gymnasium import module {module!r}; fleetrl imports no "
                         f"module that a config names. Import it in your own Problem's module (--problem="
                         f"my_pkg.nav:MyProblem) and pass the env's registered id")
