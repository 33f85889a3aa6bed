"""CartPole-v1 with an MLP agent (and an LSTM variant), trained with V-trace."""

from __future__ import annotations

import dataclasses

import gymnasium as gym

from fleetrl.agents import Agent, LSTMAgent, MLPAgent
from fleetrl.problems.base import Problem, ProblemConfig


@dataclasses.dataclass
class CartPoleConfig(ProblemConfig):
    hidden_sizes: tuple[int, ...] = (64, 64)
    learning_rate: float = 1e-3
    # Both hold V-trace at its peak (docs/algorithms.md, "Holding the policy past the peak"):
    # unscaled returns of 500 make advantages of 3-7 per step that drown the entropy bonus,
    # and the policy goes deterministic, sometimes on one action; a decaying rate stops the
    # late updates from knocking a converged policy off.
    reward_scale: float = 0.1
    learning_rate_schedule: str = "linear"
    entropy_cost: float = 0.01
    discount: float = 0.99
    max_episode_steps: int = 500
    # Separate policy and value MLPs: with a shared torso, returns of up to 500 make the
    # value loss's gradients swamp the policy's, and learning stalls or collapses.
    shared_torso: bool = False


class CartPoleProblem(Problem):
    name = "cartpole"
    Config = CartPoleConfig

    def make_env(self) -> gym.Env:
        # The passive env checker costs about a tenth of an actor's time and checks nothing new.
        # rgb_array costs nothing until render() is called: recorded episodes call it.
        return gym.make("CartPole-v1", max_episode_steps=self.config.max_episode_steps, disable_env_checker=True,
                        render_mode="rgb_array")

    def make_agent(self) -> Agent:
        (obs_spec,) = self.observation_specs()
        return MLPAgent(obs_spec.shape[0], self.action_policy().policy_logits_size(), self.config.hidden_sizes,
                        shared_torso=self.config.shared_torso)


@dataclasses.dataclass
class CartPoleLSTMConfig(CartPoleConfig):
    hidden_sizes: tuple[int, ...] = (64,)
    learning_rate: float = 1e-3
    lstm_size: int = 64


class CartPoleLSTMProblem(CartPoleProblem):
    name = "cartpole_lstm"
    Config = CartPoleLSTMConfig

    def make_agent(self) -> Agent:
        (obs_spec,) = self.observation_specs()
        return LSTMAgent(obs_spec.shape[0], self.action_policy().policy_logits_size(), self.config.hidden_sizes,
                         self.config.lstm_size)
