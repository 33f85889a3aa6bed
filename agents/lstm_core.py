"""The LSTM neck and the policy and value heads that fleetrl's recurrent agents share."""

from __future__ import annotations

import torch
from torch import nn

from fleetrl.agents.base import Agent, AgentOutput, Observation, State


class LSTMCore(Agent):
    """An agent whose neck is one LSTM cell and whose heads read the cell's output: policy
    logits and a baseline. The state is (h, c), zero at each episode start. A subclass
    builds its torso, then calls `build_core` (in that order, so that a seed gives the
    same initial weights whatever the torso)."""

    batch_key: str  # the observation whose batch size and device the zero state takes

    def build_core(self, input_size: int, lstm_size: int, num_actions: int, batch_key: str) -> None:
        self.batch_key = batch_key
        self.core = nn.LSTMCell(input_size, lstm_size)
        self.policy = nn.Linear(lstm_size, num_actions)
        self.baseline = nn.Linear(lstm_size, 1)

    def initial_state(self, observation: Observation) -> State:
        x = observation[self.batch_key]
        zeros = torch.zeros((x.shape[0], self.core.hidden_size), dtype=torch.float32, device=x.device)
        return (zeros, zeros.clone())

    def neck(self, torso_output: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        h, c = self.core(torso_output, state)
        return h, (h, c)

    def head(self, neck_output: torch.Tensor) -> AgentOutput:
        return {"policy_logits": self.policy(neck_output), "baseline": self.baseline(neck_output).squeeze(-1)}
