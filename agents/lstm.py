"""A recurrent agent: an MLP torso, then the shared LSTM neck and heads (agents/lstm_core.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fleetrl.agents.base import Observation
from fleetrl.agents.lstm_core import LSTMCore
from fleetrl.agents.mlp import mlp


class LSTMAgent(LSTMCore):
    """For partially observed tasks. The state is (h, c), zero at each episode start."""

    def __init__(self, observation_size: int, num_actions: int, hidden_sizes: Sequence[int] = (64,),
                 lstm_size: int = 64, observation_key: str = "observation"):
        super().__init__()
        self.observation_key = observation_key
        self.body = mlp(observation_size, hidden_sizes)
        self.build_core(hidden_sizes[-1], lstm_size, num_actions, batch_key=observation_key)

    def torso(self, observation: Observation) -> torch.Tensor:
        x = observation[self.observation_key]
        return self.body(x.reshape(x.shape[0], -1).float())
