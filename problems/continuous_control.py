"""Continuous control with Gaussian policies: Pendulum-v1, and a base for any Box-action env.

`GaussianPolicy` is the policy part alone, and `GaussianPolicyProblem` a Problem that
uses it, for Problems with agents of their own (LIBERO's VLA agent).

The action bounds come from the env's action space; `action_squash` picks how the policy
respects them (see `fleetrl.agents.distributions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch

from fleetrl.agents import Agent, GaussianMLPAgent
from fleetrl.agents.base import AgentOutput
from fleetrl.agents.distributions import SQUASHES, bounded_normal
from fleetrl.common.settings import check_choice, setting
from fleetrl.envs.env_ids import check_env_id
from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.base import Problem, ProblemConfig


@dataclasses.dataclass
class GaussianPolicyConfig(ProblemConfig):
    action_squash: str = setting("tanh", "How the Gaussian policy keeps to the action bounds: tanh squashes into "
                                         "them; clip clips, putting the tails' mass on the bounds.")
    initial_log_std: float = setting(0.0, "The policy's log standard deviation at the start.")

    def __post_init__(self):
        super().__post_init__()
        check_choice("action_squash", self.action_squash, SQUASHES)


class GaussianPolicy(ActionPolicy):
    """A Gaussian policy over a Box action space, from the agent's action_mean and
    action_log_std, kept to the bounds as `action_squash` says."""

    def action_distribution(self, agent_output: AgentOutput) -> torch.distributions.Distribution:
        space = self.action_space  # with chunks, [K, D]: the agent's K * D outputs are unflattened to it
        mean, log_std = agent_output["action_mean"], agent_output["action_log_std"]
        if self.config.chunk_size > 1:
            mean, log_std = mean.unflatten(-1, space.shape), log_std.unflatten(-1, space.shape)
        return bounded_normal(self.config.action_squash, mean, log_std, space.low, space.high)

    def action_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[T, B]; with chunks per token, [T, B, K, D]."""
        dist = self.action_distribution(agent_output)
        if self.config.chunk_size > 1:
            return dist.log_prob_per_dimension(actions["action"])
        return dist.log_prob(actions["action"])

    def entropy(self, agent_output: AgentOutput) -> torch.Tensor:
        dist = self.action_distribution(agent_output)
        return dist.entropy_per_dimension() if self.config.chunk_size > 1 else dist.entropy()


class GaussianPolicyProblem(Problem):
    """A Box action space and an agent that outputs action_mean and action_log_std."""

    Config = GaussianPolicyConfig

    def action_policy(self) -> ActionPolicy:
        return GaussianPolicy(self.config, self.action_space(), problem=self)


@dataclasses.dataclass
class ContinuousControlConfig(GaussianPolicyConfig):
    env_id: str = "Pendulum-v1"
    hidden_sizes: tuple[int, ...] = (64, 64)
    state_dependent_std: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_env_id(self.env_id)


class ContinuousControlProblem(GaussianPolicyProblem):
    """Any Gymnasium env with a flat Box observation and a Box action space."""

    name = "continuous_control"
    Config = ContinuousControlConfig

    def make_env(self) -> gym.Env:
        try:  # rgb_array lets recorded episodes draw it; it costs nothing until render() is called
            return gym.make(self.config.env_id, disable_env_checker=True, render_mode="rgb_array")
        except TypeError:  # an env that takes no render_mode
            return gym.make(self.config.env_id, disable_env_checker=True)

    def make_agent(self) -> Agent:
        obs_space, action_space = self._spaces
        return GaussianMLPAgent(int(np.prod(obs_space.shape)), int(np.prod(action_space.shape)),
                                self.config.hidden_sizes, self.config.state_dependent_std,
                                self.config.initial_log_std)


@dataclasses.dataclass
class PendulumConfig(ContinuousControlConfig):
    algorithm: str = "ppo"
    learning_rate: float = 1e-3
    discount: float = 0.95
    entropy_cost: float = 0.0


class PendulumProblem(ContinuousControlProblem):
    name = "pendulum"
    Config = PendulumConfig
