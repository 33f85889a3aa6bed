"""LIBERO robot manipulation: suites, reset states, and the simulator as a Gymnasium env.

Importing this package does not import libero; creating a `LiberoEnv` does, after
writing LIBERO's config (see `config.prepare_libero`).
"""

from fleetrl.envs.libero.env import SUITES, LiberoEnv
from fleetrl.envs.libero.reset_states import ResetStates

__all__ = ["SUITES", "LiberoEnv", "ResetStates"]
