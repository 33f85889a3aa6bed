"""Training algorithms: how one batch of unrolls becomes optimizer steps. Chosen by name.

An algorithm has three parts. `unroll_hook` may hold or rewrite finished unrolls before
they are batched (GRPO waits for its groups' returns). `prepare` runs once per batch,
before any update, and computes what must come from the behaviour policy (GAE advantages
from the values recorded at inference, say). `loss` runs on each minibatch of each epoch.
The trainer does the rest.

Every algorithm mixes in teacher forcing the same way: the steps of teacher-forced
episodes (the per-step extra "teacher_forcing", see fleetrl.envs.teacher_forcing) are
masked out of the RL loss and train with cross-entropy on the executed oracle action
instead, weighted by `teacher_forcing_cost`. A batch may hold both kinds.

With action chunks (see fleetrl.losses.chunks), the Problem's log-probs and entropy come
per token, and each algorithm reduces them as `logprob_type` asks, masking the actions
that never ran.

Register a new one with `ALGORITHMS["name"] = MyAlgorithm()`; select it with
`--hparams=algorithm=name` or in a Problem's config.

`loss` returns a `LossResult`: the loss, its logs (TensorBoard tags, for people), and the
typed fields the trainer acts on (`approx_kl`, for `target_kl`). The trainer never reads a tag.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fleetrl.agents.base import Agent
from fleetrl.envs.teacher_forcing import TEACHER_FORCING
from fleetrl.losses.batch import UnrollBatch
from fleetrl.losses.chunks import (
    action_level_gae,
    align_advantages,
    check_types,
    chunk_mask,
    chunk_results,
    loss_mask,
    per_step,
)
from fleetrl.losses.config import LossConfig
from fleetrl.losses.gae import gae
from fleetrl.losses.group_advantages import GROUP_ADVANTAGE, GroupAdvantages
from fleetrl.losses.ppo import APPROX_KL, categorical_kl, ppo_loss
from fleetrl.losses.training_problem import TrainingProblem
from fleetrl.losses.transitions import transitions
from fleetrl.losses.unroll_hook import UnrollHook
from fleetrl.losses.vtrace import vtrace_loss, vtrace_returns

Prepared = dict[str, torch.Tensor]  # [T, B] per-transition tensors


@dataclasses.dataclass
class LossResult:
    loss: torch.Tensor
    logs: dict[str, torch.Tensor]  # for TensorBoard
    # The mean approximate KL from the policy that acted over the RL steps (PPO's and GRPO's
    # ratio); None for an algorithm without one. The trainer's target_kl stops on it.
    approx_kl: torch.Tensor | None = None


class Algorithm:
    default_epochs = 1
    default_minibatches = 1
    # Which of the settings that only some algorithms read (ALGORITHM_SETTINGS) this one
    # reads; another of them set away from its default is refused at start, so that no
    # setting silently does nothing. None: not declared (a user's algorithm), nothing checked.
    reads: frozenset[str] | None = None

    def unroll_hook(self, config: LossConfig) -> UnrollHook:
        """What sees finished unrolls before they are batched; the base passes them through."""
        return UnrollHook()

    def prepare(self, problem: TrainingProblem, batch: UnrollBatch) -> Prepared:
        check_types(problem.config.reward_type, problem.config.logprob_type)
        steps = transitions(batch.reward * problem.config.reward_scale, batch.terminated, batch.truncated,
                            problem.config.discount)
        forced = batch.extras.get(TEACHER_FORCING)
        return {"rewards": steps.rewards, "discounts": steps.discounts, "valid": steps.valid,
                "teacher": torch.zeros_like(steps.valid) if forced is None else forced[:-1].float()}

    def targets(self, problem: TrainingProblem, agent: Agent, batch: UnrollBatch, prepared: Prepared) -> Prepared:
        """The advantages and value targets the loss trains on, [T, B], for people to read
        (`--record_unrolls`): those `prepare` computed, when it computes them."""
        return {k: prepared[k] for k in ("advantages", "returns") if k in prepared}

    def loss(self, problem: TrainingProblem, agent: Agent, batch: UnrollBatch, prepared: Prepared) -> LossResult:
        outputs, _ = agent.unroll(batch.observation, batch.first, batch.initial_state, batch.action)
        valid, teacher = prepared["valid"], prepared["teacher"]
        result = self.rl_loss(problem, outputs, batch, {**prepared, "valid": valid * (1 - teacher)})
        if TEACHER_FORCING not in batch.extras:
            return result
        forced = valid * teacher
        if forced.any():
            log_probs = per_step(batch.extras, problem.teacher_forcing_log_prob(outputs, batch.action),
                                 "chunk_level")[:-1]
            cross_entropy = -(log_probs * forced).sum() / forced.sum()
            result.loss = result.loss + problem.config.teacher_forcing_cost * cross_entropy
            result.logs["loss/teacher_forcing"] = cross_entropy.detach()
        result.logs["teacher_forcing/fraction"] = forced.sum() / valid.sum().clamp(min=1)
        return result

    def rl_loss(self, problem: TrainingProblem, outputs: dict[str, torch.Tensor], batch: UnrollBatch,
                prepared: Prepared) -> LossResult:
        """The RL loss over the transitions where prepared["valid"] is 1."""
        raise NotImplementedError


class Supervised(Algorithm):
    """Teacher forcing alone: no RL loss (use with teacher_forcing_fraction=1)."""

    reads = frozenset()

    def rl_loss(self, problem, outputs, batch, prepared):
        # Zero, but tied to the outputs, so that a batch without forced steps still backpropagates.
        return LossResult(sum(v.sum() for v in outputs.values()) * 0.0, {})


class VTrace(Algorithm):
    """IMPALA's off-policy actor-critic (`fleetrl.losses.vtrace`)."""

    reads = frozenset({"rho_bar", "c_bar", "pg_rho_bar", "lambda_"})

    def prepare(self, problem, batch):
        if (problem.config.reward_type, problem.config.logprob_type) != ("chunk_level", "chunk_level"):
            raise ValueError("vtrace takes one reward and one log-prob per step: with action chunks use "
                             "reward_type=chunk_level and logprob_type=chunk_level, or algorithm=ppo")
        return super().prepare(problem, batch)

    @torch.no_grad()
    def targets(self, problem, agent, batch, prepared):
        """V-trace's targets depend on the policy being trained: these are the current weights'."""
        outputs, _ = agent.unroll(batch.observation, batch.first, batch.initial_state, batch.action)
        target_log_probs = per_step(batch.extras, problem.action_log_prob(outputs, batch.action), "chunk_level")
        behaviour_log_probs = per_step(batch.extras, batch.behaviour_log_prob, "chunk_level")
        values, config = outputs["baseline"], problem.config
        returns = vtrace_returns(target_log_probs[:-1] - behaviour_log_probs[:-1], prepared["discounts"],
                                 prepared["rewards"], values[:-1], values[-1], rho_bar=config.rho_bar,
                                 c_bar=config.c_bar, pg_rho_bar=config.pg_rho_bar, lambda_=config.lambda_,
                                 valid=prepared["valid"])
        return {"advantages": returns.pg_advantages, "returns": returns.vs}

    def rl_loss(self, problem, outputs, batch, prepared):
        return LossResult(*vtrace_loss(
            target_log_probs=per_step(batch.extras, problem.action_log_prob(outputs, batch.action), "chunk_level"),
            entropy=per_step(batch.extras, problem.entropy(outputs), "chunk_level"),
            values=outputs["baseline"],
            behaviour_log_probs=per_step(batch.extras, batch.behaviour_log_prob, "chunk_level"),
            rewards=prepared["rewards"], discounts=prepared["discounts"], valid=prepared["valid"],
            config=problem.config,
        ))


class PPO(Algorithm):
    """Clipped PPO on GAE advantages from the values recorded at inference (`fleetrl.losses.ppo`).

    With action chunks, `reward_type=action_level` runs GAE over actions, and
    `logprob_type` sets whether a ratio is per chunk, per action or per token."""

    reads = frozenset({"gae_lambda", "clip_eps_low", "clip_eps_high", "dual_clip", "value_clip_eps",
                       "normalize_advantages", "target_kl"})
    default_epochs = 4
    default_minibatches = 4

    def prepare(self, problem, batch):
        config = problem.config
        prepared = super().prepare(problem, batch)
        values, chunks = batch.behaviour_value, chunk_results(batch.extras)
        if config.reward_type == "action_level" and chunks is not None:
            action_rewards, executed = chunks
            estimate = action_level_gae(action_rewards[1:], executed[1:], prepared["discounts"],
                                        values[:-1], values[-1], prepared["valid"], config.discount, config.gae_lambda)
        else:
            estimate = gae(prepared["rewards"], prepared["discounts"], values[:-1], values[-1],
                           config.gae_lambda, prepared["valid"])
        prepared.update(advantages=estimate.advantages, returns=estimate.returns)
        return prepared

    def rl_loss(self, problem, outputs, batch, prepared):
        level = problem.config.logprob_type
        log_probs = per_step(batch.extras, problem.action_log_prob(outputs, batch.action), level)[:-1]
        mask, returns = chunk_mask(batch.extras), prepared["returns"]
        values = outputs["baseline"][:-1]
        old_values = batch.behaviour_value[:-1]
        if returns.dim() > values.dim():  # action-level value targets: the chunk's value stands in
            values, old_values = values.unsqueeze(-1).expand_as(returns), old_values.unsqueeze(-1).expand_as(returns)
        loss, logs = ppo_loss(
            log_probs=log_probs, old_log_probs=per_step(batch.extras, batch.behaviour_log_prob, level)[:-1],
            advantages=align_advantages(prepared["advantages"], log_probs.shape),
            values=values, old_values=old_values, returns=returns,
            entropy=per_step(batch.extras, problem.entropy(outputs), "chunk_level")[:-1],
            valid=loss_mask(prepared["valid"], mask, log_probs.shape),
            value_valid=loss_mask(prepared["valid"], mask, returns.shape), entropy_valid=prepared["valid"],
            config=problem.config,
            anchor_kl=(categorical_kl(prepared["anchor_logits"][:-1], outputs["policy_logits"][:-1])
                       if "anchor_logits" in prepared else None),
        )
        return LossResult(loss, logs, approx_kl=logs[APPROX_KL])


class GRPO(Algorithm):
    """Group-relative policy optimization for envs (as RLinf runs it): PPO's clipped objective
    on each episode's return normalized within its group (`fleetrl.losses.group_advantages`),
    with no value function. Needs group_size > 1.

    Its unrolls wait for whole group episodes, so its data is older than PPO's: one pass
    of one minibatch per batch (the default) keeps the policy lag low."""

    reads = frozenset({"clip_eps_low", "clip_eps_high", "dual_clip", "target_kl"})

    def unroll_hook(self, config):
        return GroupAdvantages(config.group_size, config.max_waiting_unrolls)

    def prepare(self, problem, batch):
        return {**super().prepare(problem, batch), "advantages": batch.extras[GROUP_ADVANTAGE][:-1]}

    def rl_loss(self, problem, outputs, batch, prepared):
        level = problem.config.logprob_type
        log_probs = per_step(batch.extras, problem.action_log_prob(outputs, batch.action), level)[:-1]
        no_value = torch.zeros_like(prepared["advantages"])
        loss, logs = ppo_loss(
            log_probs=log_probs, old_log_probs=per_step(batch.extras, batch.behaviour_log_prob, level)[:-1],
            advantages=align_advantages(prepared["advantages"], log_probs.shape),
            values=no_value, old_values=no_value, returns=no_value,
            entropy=per_step(batch.extras, problem.entropy(outputs), "chunk_level")[:-1],
            valid=loss_mask(prepared["valid"], chunk_mask(batch.extras), log_probs.shape),
            value_valid=prepared["valid"], entropy_valid=prepared["valid"],
            config=dataclasses.replace(problem.config, baseline_cost=0.0, normalize_advantages=False),
        )
        for name in ("loss/value", "value/explained_variance"):  # no value function: nothing to report
            logs.pop(name)
        return LossResult(loss, logs, approx_kl=logs[APPROX_KL])


ALGORITHMS: dict[str, Algorithm] = {"vtrace": VTrace(), "ppo": PPO(), "grpo": GRPO(), "supervised": Supervised()}


# The settings only some algorithms read: each built-in algorithm declares its share (`reads`).
ALGORITHM_SETTINGS = ("rho_bar", "c_bar", "pg_rho_bar", "lambda_", "gae_lambda", "clip_eps_low", "clip_eps_high",
                      "dual_clip", "value_clip_eps", "normalize_advantages", "target_kl")


def unread_setting(config: LossConfig, defaults: Any) -> str | None:
    """Why `config` sets a value that its algorithm never reads (one away from `defaults`,
    the config class's own), naming the algorithms that do read it; None if it sets none."""
    algorithm = ALGORITHMS[config.algorithm]
    if algorithm.reads is None:
        return None
    for name in ALGORITHM_SETTINGS:
        if name not in algorithm.reads and getattr(config, name) != getattr(defaults, name):
            readers = sorted(k for k, a in ALGORITHMS.items() if a.reads is not None and name in a.reads)
            return (f"{name}={getattr(config, name)} does nothing under algorithm={config.algorithm}: only "
                    f"{', '.join(readers)} read it. Leave it at its default, or choose one of those algorithms")
    return None


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]
