"""A feed-forward agent for vector observations (CartPole-class control)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from fleetrl.agents.base import Agent, AgentOutput, Observation


def mlp(input_size: int, hidden_sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(input_size, size), nn.Tanh()]
        input_size = size
    return nn.Sequential(*layers)


class MLPAgent(Agent):
    """Torso: an MLP on one flat observation. Neck: none. Head: policy logits and a baseline.

    With `shared_torso=False` the baseline has an MLP of its own, so the large value-loss
    gradients of long episodes do not disturb the policy's features.
    """

    def __init__(self, observation_size: int, num_actions: int, hidden_sizes: Sequence[int] = (64, 64),
                 observation_key: str = "observation", shared_torso: bool = True):
        super().__init__()
        self.observation_key = observation_key
        self.body = mlp(observation_size, hidden_sizes)
        self.value_body = None if shared_torso else mlp(observation_size, hidden_sizes)
        self.policy = nn.Linear(hidden_sizes[-1], num_actions)
        self.baseline = nn.Linear(hidden_sizes[-1], 1)

    def torso(self, observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        x = observation[self.observation_key]
        x = x.reshape(x.shape[0], -1).float()
        features = self.body(x)
        return features, features if self.value_body is None else self.value_body(x)

    def head(self, neck_output: tuple[torch.Tensor, torch.Tensor]) -> AgentOutput:
        policy_features, value_features = neck_output
        return {"policy_logits": self.policy(policy_features), "baseline": self.baseline(value_features).squeeze(-1)}
