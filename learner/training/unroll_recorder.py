"""`--record_unrolls=N`: the first N training batches as the loss saw them, in one file of
named arrays (`<logdir>/recorded_unrolls.npz`), for `fleetrl.launch.inspect` and for people.

Each field is stacked over the recorded batches: [N, T+1, B, ...] for what the actors and
inference recorded (observation/*, action/*, extra/*, reward, terminated, truncated,
first, behaviour_log_prob, behaviour_value, policy_version), [N, T, B] for what the loss
computed (loss/advantages, loss/returns, loss/valid). The action space's bounds go beside
them (space/action/<name>/low and high), so that actions outside it can be found. Nothing
is pickled: numpy reads the file with allow_pickle=False.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from fleetrl.common.files import atomic_write
from fleetrl.losses.batch import UnrollBatch

log = logging.getLogger(__name__)

FILE_NAME = "recorded_unrolls.npz"


def space_bounds(space: gym.Space, name: str = "action") -> dict[str, np.ndarray]:
    """space/action/<name>/low and high of a Discrete, MultiDiscrete or Box space (or a Dict
    of them); nothing for a space without bounds one can check."""
    if isinstance(space, gym.spaces.Dict):
        return {k: v for key, sub in space.spaces.items() for k, v in space_bounds(sub, key).items()}
    if isinstance(space, gym.spaces.Discrete):
        low, high = np.array(space.start), np.array(space.start + space.n - 1)
    elif isinstance(space, gym.spaces.MultiDiscrete):
        low, high = np.zeros_like(space.nvec), space.nvec - 1
    elif isinstance(space, gym.spaces.Box):
        low, high = space.low, space.high
    else:
        return {}
    return {f"space/action/{name}/low": np.asarray(low), f"space/action/{name}/high": np.asarray(high)}


class UnrollRecorder:
    def __init__(self, path: str, batches: int, action_space: gym.Space | None):
        self.path = path
        self.batches = batches
        self._bounds = space_bounds(action_space) if action_space is not None else {}
        self._recorded: list[dict[str, np.ndarray]] = []
        self._written = 0  # batches in the file

    @property
    def wants_more(self) -> bool:
        return len(self._recorded) < self.batches

    def add(self, batch: UnrollBatch, targets: Mapping[str, torch.Tensor], valid: torch.Tensor) -> None:
        """One batch and the loss's targets for it; the file is written at the N-th."""
        if not self.wants_more:
            return
        fields = {f"observation/{k}": v for k, v in batch.observation.items()}
        fields.update({f"action/{k}": v for k, v in batch.action.items()})
        fields.update({f"extra/{k}": v for k, v in batch.extras.items()})
        fields.update(reward=batch.reward, terminated=batch.terminated, truncated=batch.truncated, first=batch.first,
                      behaviour_log_prob=batch.behaviour_log_prob, behaviour_value=batch.behaviour_value,
                      policy_version=batch.policy_version)
        fields.update({f"loss/{k}": v for k, v in targets.items()})
        fields["loss/valid"] = valid
        self._recorded.append({k: v.detach().cpu().numpy() for k, v in fields.items()})
        if not self.wants_more:
            self.write()

    def write(self) -> None:
        """Writes what was recorded so far (also at a run's end that came before N batches)."""
        if len(self._recorded) == self._written:
            return
        arrays = {k: np.stack([batch[k] for batch in self._recorded]) for k in self._recorded[0]}
        try:
            atomic_write(self.path, lambda f: np.savez_compressed(f, **arrays, **self._bounds))
        except OSError as e:
            log.error("recorded unrolls not written to %s: %s", self.path, e)
            return
        log.info("recorded %d training batches to %s: python -m fleetrl.launch.inspect %s", len(self._recorded),
                 self.path, self.path)
        self._written = self.batches = len(self._recorded)  # written: record no more


def recorder_for(logdir: str, batches: int, action_space: gym.Space | None) -> UnrollRecorder | None:
    return UnrollRecorder(os.path.join(logdir, FILE_NAME), batches, action_space) if batches else None
