"""A recurrent agent: MLP torso, LSTM neck, policy/value head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.agents.mlp import mlp


class LSTMAgent(Agent):
    """For partially observed tasks. The state is (h, c), zero at each episode start."""

    def __init__(self, observation_size: int, num_actions: int, hidden_sizes: Sequence[int] = (64,),
                 lstm_size: int = 64, observation_key: str = "observation"):
        super().__init__()
        self.observation_key = observation_key
        self.body = mlp(observation_size, hidden_sizes)
        self.core = nn.LSTMCell(hidden_sizes[-1], lstm_size)
        self.policy = nn.Linear(lstm_size, num_actions)
        self.baseline = nn.Linear(lstm_size, 1)

    def initial_state(self, observation: Observation) -> State:
        x = observation[self.observation_key]
        zeros = x.new_zeros((x.shape[0], self.core.hidden_size), dtype=torch.float32)
        return (zeros, zeros.clone())

    def torso(self, observation: Observation) -> torch.Tensor:
        x = observation[self.observation_key]
        return self.body(x.reshape(x.shape[0], -1).float())

    def neck(self, torso_output: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        h, c = self.core(torso_output, state)
        return h, (h, c)

    def head(self, neck_output: torch.Tensor) -> AgentOutput:
        return {"policy_logits": self.policy(neck_output), "baseline": self.baseline(neck_output).squeeze(-1)}
