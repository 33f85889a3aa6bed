"""Room-to-Room vision-and-language navigation: readers, the environment, metrics and synthetic data."""

from fleetrl.envs.r2r.env import R2RData, R2REnv
from fleetrl.envs.r2r.graph import DataError, ScanGraph, load_scan_graph
from fleetrl.envs.r2r.instructions import Episode, read_instructions
from fleetrl.envs.r2r.metrics import episode_metrics
from fleetrl.envs.r2r.vocab import Vocab

__all__ = ["DataError", "Episode", "R2RData", "R2REnv", "ScanGraph", "Vocab", "episode_metrics",
           "load_scan_graph", "read_instructions"]
