"""How a Problem's agent outputs become actions and log-probabilities: its action policy.

The learner asks a Problem for its `ActionPolicy` once (`Problem.action_policy()`) and calls
it on every inference step (which actions the actors execute) and every training step
(the log-probs and entropy the losses read; it is the `TrainingProblem` that
`fleetrl.losses` takes). The default is a categorical policy over the agent's
`policy_logits`; `GaussianPolicy` (problems/continuous_control.py), the flow VLA's and the
VLM's text policy are subclasses.

A Problem written before action policies existed may still define these methods on
itself (`action_distribution`, `select_actor_action`, ...): the default policy adopts
them, so it keeps working unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch

from fleetrl.agents.base import AgentOutput, Observation
from fleetrl.envs.teacher_forcing import TEACHER_FORCING
from fleetrl.proto.tensors import Specs

# What an action policy decides; a Problem that defines one of these itself overrides it.
POLICY_METHODS = ("action_distribution", "select_actor_action", "action_log_prob", "teacher_forcing_log_prob",
                  "entropy", "policy_logits_size", "learner_action_specs")


def categorical_logits_size(space: gym.Space, problem_name: str = "this Problem") -> int:
    """How many logits a categorical policy over `space` reads: the Discrete space's n, or
    K * n for chunks of K actions (a MultiDiscrete space)."""
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise ValueError(f"{problem_name}: the categorical policy needs a Discrete action space, not "
                     f"{type(space).__name__}; return another ActionPolicy from action_policy()")


class ActionPolicy:
    """The policy over the single action "action": categorical over `policy_logits`, one
    categorical per action of a chunk. `config` is the Problem's (the losses read it too),
    `action_space` the env's."""

    def __init__(self, config: Any, action_space: gym.Space, problem: Any = None):
        self.config, self.action_space = config, action_space
        self.problem_name = type(problem).__name__ if problem is not None else "this Problem"
        for name in POLICY_METHODS:  # a Problem's own older-style hooks win over the defaults
            if problem is not None and any(name in vars(klass) for klass in type(problem).__mro__):
                setattr(self, name, getattr(problem, name))

    def policy_logits_size(self) -> int:
        """How many logits the categorical policy reads."""
        return categorical_logits_size(self.action_space, self.problem_name)

    def action_distribution(self, agent_output: AgentOutput) -> torch.distributions.Distribution:
        logits = agent_output["policy_logits"]
        if self.config.chunk_size > 1:
            logits = logits.unflatten(-1, (self.config.chunk_size, -1))
        # The logits come from the agent, not from users: checking their support each call costs more than the op.
        return torch.distributions.Categorical(logits=logits, validate_args=False)

    def select_actor_action(self, agent_output: AgentOutput, observation: Observation,
                            extras: Mapping[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        """The actions the actors execute: a sample, or the mode when deterministic (eval),
        or the oracle's action in teacher-forced episodes (the extra "teacher_forcing")."""
        dist = self.action_distribution(agent_output)
        action = dist.mode if deterministic else dist.sample()
        forced = extras.get(TEACHER_FORCING)
        if forced is not None and bool(forced.any()):
            oracle = observation[self.config.oracle_key].to(action.dtype)
            action = torch.where(forced.reshape(-1, *[1] * (action.dim() - 1)), oracle, action)
        return {"action": action}

    def action_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[T, B] log-probs; with action chunks, unreduced: [T, B, K] or [T, B, K, D] per
        token, which the algorithm sums as `logprob_type` says (fleetrl.losses.chunks)."""
        return self.action_distribution(agent_output).log_prob(actions["action"])

    def teacher_forcing_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """What teacher forcing's cross-entropy maximizes on the oracle's actions; the policy's
        log-prob by default (a text policy counts every token of the oracle's answer fully)."""
        return self.action_log_prob(agent_output, actions)

    def entropy(self, agent_output: AgentOutput) -> torch.Tensor:
        """The policy's entropy, in the shape of `action_log_prob`."""
        return self.action_distribution(agent_output).entropy()

    def learner_action_specs(self) -> Specs:
        """Fields of `select_actor_action`'s output that the learner records with each step,
        for training, and never sends to actors (a flow policy's denoising chain, say); the
        actors get the action space's fields alone. Declare each one's dtype and shape."""
        return ()
