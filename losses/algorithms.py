"""Training algorithms: how one batch of unrolls becomes optimizer steps. Chosen by name.

An algorithm has two parts. `prepare` runs once per batch, before any update, and computes
what must come from the behaviour policy (GAE advantages from the values recorded at
inference, say). `loss` runs on each minibatch of each epoch. The trainer does the rest.

Every algorithm mixes in teacher forcing the same way: the steps of teacher-forced
episodes (where the oracle's action was executed) are masked out of the RL loss and train
with cross-entropy on that action instead, weighted by `teacher_forcing_cost`. A batch may
hold both kinds.

With action chunks (see fleetrl.losses.chunks), the Problem's log-probs and entropy come
per token, and each algorithm reduces them as `logprob_type` asks, masking the actions
that never ran.

Register a new one with `ALGORITHMS["name"] = MyAlgorithm()`; select it with
`--hparams=algorithm=name` or in a Problem's config.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from fleetrl.learner.unroll import UnrollBatch
from fleetrl.losses.chunks import (action_level_gae, align_advantages, check_types, executed_mask, loss_mask,
                                   reduce_log_probs)
from fleetrl.losses.gae import gae
from fleetrl.losses.ppo import ppo_loss
from fleetrl.losses.transitions import transitions
from fleetrl.losses.vtrace import vtrace_loss

if TYPE_CHECKING:
    from fleetrl.agents.base import Agent
    from fleetrl.problems.base import Problem

Prepared = dict[str, torch.Tensor]  # [T, B] per-transition tensors
LossAndLogs = tuple[torch.Tensor, dict[str, torch.Tensor]]


def per_step(batch: UnrollBatch, tokens: torch.Tensor, level: str) -> torch.Tensor:
    """Per-token log-probs (or entropies) of the T+1 steps, reduced to `level`.

    Without action chunks they are already one per step. With chunks, the actions chosen
    at step t ran in the transition to t+1, whose step reports how many ran; the last
    step's chunk has not run yet and counts whole.
    """
    if batch.actions_executed is None:
        return tokens
    chunk_size = tokens.shape[2]
    ran = torch.cat([batch.actions_executed[1:], torch.full_like(batch.actions_executed[:1], chunk_size)])
    return reduce_log_probs(tokens, executed_mask(ran, chunk_size), level)


def chunk_mask(batch: UnrollBatch) -> torch.Tensor | None:
    """[T, B, K]: the actions of each transition's chunk that ran (None without chunks)."""
    if batch.actions_executed is None:
        return None
    return executed_mask(batch.actions_executed[1:], batch.action_rewards.shape[-1])


class Algorithm:
    default_epochs = 1
    default_minibatches = 1

    def prepare(self, problem: "Problem", batch: UnrollBatch) -> Prepared:
        check_types(problem.config.reward_type, problem.config.logprob_type)
        steps = transitions(batch.reward, batch.terminated, batch.truncated, problem.config.discount)
        return {"rewards": steps.rewards, "discounts": steps.discounts, "valid": steps.valid,
                "teacher": batch.teacher_forcing[:-1].float()}

    def loss(self, problem: "Problem", agent: "Agent", batch: UnrollBatch, prepared: Prepared) -> LossAndLogs:
        outputs, _ = agent.unroll(batch.observation, batch.first, batch.initial_state)
        valid, teacher = prepared["valid"], prepared["teacher"]
        loss, logs = self.rl_loss(problem, outputs, batch, {**prepared, "valid": valid * (1 - teacher)})
        forced = valid * teacher
        if forced.any():
            log_probs = per_step(batch, problem.action_log_prob(outputs, batch.action), "chunk_level")[:-1]
            cross_entropy = -(log_probs * forced).sum() / forced.sum()
            loss = loss + problem.config.teacher_forcing_cost * cross_entropy
            logs["loss/teacher_forcing"] = cross_entropy.detach()
        logs["teacher_forcing/fraction"] = forced.sum() / valid.sum().clamp(min=1)
        return loss, logs

    def rl_loss(self, problem: "Problem", outputs: dict[str, torch.Tensor], batch: UnrollBatch,
                prepared: Prepared) -> LossAndLogs:
        """The RL loss over the transitions where prepared["valid"] is 1."""
        raise NotImplementedError


class Supervised(Algorithm):
    """Teacher forcing alone: no RL loss (use with teacher_forcing_fraction=1)."""

    def rl_loss(self, problem, outputs, batch, prepared):
        # Zero, but tied to the outputs, so that a batch without forced steps still backpropagates.
        return sum(v.sum() for v in outputs.values()) * 0.0, {}


class VTrace(Algorithm):
    """IMPALA's off-policy actor-critic (`fleetrl.losses.vtrace`)."""

    def prepare(self, problem, batch):
        if (problem.config.reward_type, problem.config.logprob_type) != ("chunk_level", "chunk_level"):
            raise ValueError("vtrace takes one reward and one log-prob per step: with action chunks use "
                             "reward_type=chunk_level and logprob_type=chunk_level, or algorithm=ppo")
        return super().prepare(problem, batch)

    def rl_loss(self, problem, outputs, batch, prepared):
        return vtrace_loss(
            target_log_probs=per_step(batch, problem.action_log_prob(outputs, batch.action), "chunk_level"),
            entropy=per_step(batch, problem.entropy(outputs), "chunk_level"),
            values=outputs["baseline"], behaviour_log_probs=per_step(batch, batch.behaviour_log_prob, "chunk_level"),
            rewards=prepared["rewards"], discounts=prepared["discounts"], valid=prepared["valid"],
            config=problem.config,
        )


class PPO(Algorithm):
    """Clipped PPO on GAE advantages from the values recorded at inference (`fleetrl.losses.ppo`).

    With action chunks, `reward_type=action_level` runs GAE over actions, and
    `logprob_type` sets whether a ratio is per chunk, per action or per token."""

    default_epochs = 4
    default_minibatches = 4

    def prepare(self, problem, batch):
        config = problem.config
        prepared = super().prepare(problem, batch)
        values = batch.behaviour_value
        if config.reward_type == "action_level" and batch.action_rewards is not None:
            estimate = action_level_gae(batch.action_rewards[1:], batch.actions_executed[1:], prepared["discounts"],
                                        values[:-1], values[-1], prepared["valid"], config.discount, config.gae_lambda)
        else:
            estimate = gae(prepared["rewards"], prepared["discounts"], values[:-1], values[-1],
                           config.gae_lambda, prepared["valid"])
        prepared.update(advantages=estimate.advantages, returns=estimate.returns)
        return prepared

    def rl_loss(self, problem, outputs, batch, prepared):
        level = problem.config.logprob_type
        log_probs = per_step(batch, problem.action_log_prob(outputs, batch.action), level)[:-1]
        mask, returns = chunk_mask(batch), prepared["returns"]
        values = outputs["baseline"][:-1]
        old_values = batch.behaviour_value[:-1]
        if returns.dim() > values.dim():  # action-level value targets: the chunk's value stands in
            values, old_values = values.unsqueeze(-1).expand_as(returns), old_values.unsqueeze(-1).expand_as(returns)
        return ppo_loss(
            log_probs=log_probs, old_log_probs=per_step(batch, batch.behaviour_log_prob, level)[:-1],
            advantages=align_advantages(prepared["advantages"], log_probs.shape),
            values=values, old_values=old_values, returns=returns,
            entropy=per_step(batch, problem.entropy(outputs), "chunk_level")[:-1],
            valid=loss_mask(prepared["valid"], mask, log_probs.shape),
            value_valid=loss_mask(prepared["valid"], mask, returns.shape), entropy_valid=prepared["valid"],
            config=problem.config,
        )


class GRPO(Algorithm):
    """Group-relative policy optimization for envs (as RLinf runs it): PPO's clipped objective
    on each episode's return normalized within its group (`fleetrl.learner.group_scores`),
    with no value function. Needs group_size > 1.

    Its unrolls wait for whole group episodes, so its data is older than PPO's: one pass
    of one minibatch per batch (the default) keeps the policy lag low."""

    def prepare(self, problem, batch):
        if batch.group_advantage is None:
            raise ValueError("GRPO needs group advantages: set group_size > 1 in the Problem's config")
        return {**super().prepare(problem, batch), "advantages": batch.group_advantage[:-1]}

    def rl_loss(self, problem, outputs, batch, prepared):
        level = problem.config.logprob_type
        log_probs = per_step(batch, problem.action_log_prob(outputs, batch.action), level)[:-1]
        no_value = torch.zeros_like(prepared["advantages"])
        return ppo_loss(
            log_probs=log_probs, old_log_probs=per_step(batch, batch.behaviour_log_prob, level)[:-1],
            advantages=align_advantages(prepared["advantages"], log_probs.shape),
            values=no_value, old_values=no_value, returns=no_value,
            entropy=per_step(batch, problem.entropy(outputs), "chunk_level")[:-1],
            valid=loss_mask(prepared["valid"], chunk_mask(batch), log_probs.shape),
            value_valid=prepared["valid"], entropy_valid=prepared["valid"],
            config=dataclasses.replace(problem.config, baseline_cost=0.0, normalize_advantages=False),
        )


ALGORITHMS: dict[str, Algorithm] = {"vtrace": VTrace(), "ppo": PPO(), "grpo": GRPO(), "supervised": Supervised()}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]
