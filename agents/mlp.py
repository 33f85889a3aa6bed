"""A feed-forward agent for vector observations (CartPole-class control)."""

from __future__ import annotations

from collections.abc import Sequence

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

    By default the baseline has an MLP of its own, so the large value-loss gradients of long
    episodes do not disturb the policy's features (with one shared torso, returns in the
    hundreds, as CartPole's and Acrobot's, stall or collapse learning). `shared_torso=True`
    shares it: fewer weights, for short episodes with small returns.
    """

    def __init__(self, observation_size: int, num_actions: int, hidden_sizes: Sequence[int] = (64, 64),
                 observation_key: str = "observation", shared_torso: bool = False):
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


class GaussianMLPAgent(Agent):
    """For continuous actions: outputs action_mean, action_log_std and a baseline.

    The log-std is a learned parameter per action dimension, or (state_dependent_std) a
    head of its own. Policy and value have separate MLPs.
    """

    def __init__(self, observation_size: int, action_size: int, hidden_sizes: Sequence[int] = (64, 64),
                 state_dependent_std: bool = False, initial_log_std: float = 0.0,
                 observation_key: str = "observation"):
        super().__init__()
        self.observation_key = observation_key
        self.body = mlp(observation_size, hidden_sizes)
        self.value_body = mlp(observation_size, hidden_sizes)
        self.mean = nn.Linear(hidden_sizes[-1], action_size)
        self.baseline = nn.Linear(hidden_sizes[-1], 1)
        if state_dependent_std:
            self.log_std_head = nn.Linear(hidden_sizes[-1], action_size)
            nn.init.zeros_(self.log_std_head.weight)
            nn.init.constant_(self.log_std_head.bias, initial_log_std)
        else:
            self.log_std = nn.Parameter(torch.full((action_size,), initial_log_std))
        self.state_dependent_std = state_dependent_std

    def torso(self, observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        x = observation[self.observation_key]
        x = x.reshape(x.shape[0], -1).float()
        return self.body(x), self.value_body(x)

    def head(self, neck_output: tuple[torch.Tensor, torch.Tensor]) -> AgentOutput:
        policy_features, value_features = neck_output
        mean = self.mean(policy_features)
        log_std = self.log_std_head(policy_features) if self.state_dependent_std else self.log_std.expand_as(mean)
        return {"action_mean": mean, "action_log_std": log_std,
                "baseline": self.baseline(value_features).squeeze(-1)}
