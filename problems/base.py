"""The Problem API, after VALAN's `problem_type.py`.

A Problem is everything task-specific, in one place that fits on a page:

- actor side: `make_env` and `episode_metrics` (actors never build an agent);
- learner side: `make_agent`, `make_optimizer`, the action distribution,
  `select_actor_action`, and the training `algorithm` (see fleetrl.losses.algorithms).

A Problem holds its config and nothing else: no counters, no buffers, no RNG. All run
state lives in the learner and actor, so a Problem can be rebuilt anywhere from its name
and its `--hparams` (which is exactly how actors get theirs).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Mapping

import gymnasium as gym
import torch

from fleetrl.agents.base import Agent, AgentOutput, Observation
from fleetrl.losses.algorithms import Algorithm, get_algorithm
from fleetrl.losses.config import LossConfig
from fleetrl.problems.hparams import apply_hparams
from fleetrl.proto.tensors import Specs, specs_from_space


@dataclasses.dataclass
class ProblemConfig(LossConfig):
    """Settings every Problem has: the loss (see LossConfig) and the optimizer. Subclasses add their own."""

    learning_rate: float = 1e-3
    adam_eps: float = 1e-8
    max_grad_norm: float = 40.0
    # The share of episodes that execute the oracle's action and train with cross-entropy
    # on it instead of RL (VALAN mixes both for navigation). Needs the oracle in the
    # observation under `oracle_key`.
    teacher_forcing_fraction: float = 0.0
    teacher_forcing_cost: float = 1.0
    oracle_key: str = "oracle_action"


class Problem:
    """Base class. Subclasses set `name` and `Config`, and implement `make_env` and `make_agent`."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = ProblemConfig

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()

    @classmethod
    def from_hparams(cls, overrides: Mapping[str, str]) -> "Problem":
        return cls(apply_hparams(cls.Config(), overrides))

    # ----- actor side -----

    def make_env(self) -> gym.Env:
        """One environment. Actors build many, step them as a batch and seed them through reset."""
        raise NotImplementedError

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        """Extra metrics of an episode from its last step's info ('return' and 'length' are automatic)."""
        return {}

    # ----- specs, shared by both sides and checked at the handshake -----

    @functools.cached_property
    def _spaces(self) -> tuple[gym.Space, gym.Space]:
        env = self.make_env()
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def observation_specs(self) -> Specs:
        return specs_from_space(self._spaces[0], "observation")

    def action_specs(self) -> Specs:
        return specs_from_space(self._spaces[1], "action")

    # ----- learner side -----

    def make_agent(self) -> Agent:
        raise NotImplementedError

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.config.learning_rate, eps=self.config.adam_eps)

    def action_distribution(self, agent_output: AgentOutput) -> torch.distributions.Distribution:
        """The policy over the single action "action"; the default is categorical over policy_logits."""
        return torch.distributions.Categorical(logits=agent_output["policy_logits"])

    def draw_teacher_forcing(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """For `count` starting episodes: which ones are teacher-forced. Override to choose otherwise."""
        return torch.rand(count, generator=generator) < self.config.teacher_forcing_fraction

    def select_actor_action(self, agent_output: AgentOutput, observation: Observation,
                            deterministic: bool = False,
                            teacher_forcing: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The actions the actors execute: a sample, or the mode when deterministic, or the
        oracle's action in teacher-forced episodes."""
        dist = self.action_distribution(agent_output)
        action = dist.mode if deterministic else dist.sample()
        if teacher_forcing is not None and bool(teacher_forcing.any()):
            oracle = observation[self.config.oracle_key].to(action.dtype)
            action = torch.where(teacher_forcing.reshape(-1, *[1] * (action.dim() - 1)), oracle, action)
        return {"action": action}

    def action_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.action_distribution(agent_output).log_prob(actions["action"])

    def entropy(self, agent_output: AgentOutput) -> torch.Tensor:
        return self.action_distribution(agent_output).entropy()

    def algorithm(self) -> Algorithm:
        """How batches of unrolls train the agent; the default is `config.algorithm` from the registry."""
        return get_algorithm(self.config.algorithm)
