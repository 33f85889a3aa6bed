"""Action chunks in the loss: how K actions per step meet rewards, log-probs and advantages.

A chunked policy emits K actions per step, each of D dimensions (tokens). The env may stop
a chunk early at an episode end; actions that never ran are masked everywhere. Each step's
per-step extras (see fleetrl.envs.action_chunks) say how many of the chunk that led to it
ran, and each one's reward. The options (the chunk-level and action-level rewards and
log-probs that the RLinf framework offers for VLA training):

- `reward_type`: `chunk_level` trains on one reward per step, the chunk's sum (what the
  actor reports as the step's reward); `action_level` keeps the K rewards, and GAE runs
  over actions, discounting by gamma per action.
- `logprob_type`: `chunk_level` sums the log-prob over the K actions and the D dimensions
  (one ratio per chunk); `action_level` sums over dimensions only (one ratio per action);
  `token_level` keeps every dimension (one ratio per token).

Advantages are broadcast to the log-probs' shape. Action-level advantages meet
chunk-level log-probs through the chunk's first action, whose advantage covers the chunk.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fleetrl.common.settings import check_choice
from fleetrl.envs.action_chunks import ACTION_REWARDS, ACTIONS_EXECUTED
from fleetrl.losses.backward_scan import discounted_backward_sum
from fleetrl.losses.config import LOGPROB_TYPES, REWARD_TYPES
from fleetrl.losses.gae import GAEReturns


def check_types(reward_type: str, logprob_type: str) -> None:
    check_choice("reward_type", reward_type, REWARD_TYPES)
    check_choice("logprob_type", logprob_type, LOGPROB_TYPES)


def chunk_results(extras: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each step's per-action rewards [T+1, B, K] and actions executed [T+1, B], from the
    batch's extras; None for a Problem without action chunks."""
    if ACTIONS_EXECUTED not in extras:
        return None
    return extras[ACTION_REWARDS], extras[ACTIONS_EXECUTED]


def per_step(extras: Mapping[str, torch.Tensor], tokens: torch.Tensor, level: str) -> torch.Tensor:
    """Per-token log-probs (or entropies) of the T+1 steps, reduced to `level`.

    Without action chunks they are already one per step. With chunks, the actions chosen
    at step t ran in the transition to t+1, whose step reports how many ran; the last
    step's chunk has not run yet and counts whole.
    """
    chunks = chunk_results(extras)
    if chunks is None:
        return tokens
    executed, chunk_size = chunks[1], tokens.shape[2]
    ran = torch.cat([executed[1:], torch.full_like(executed[:1], chunk_size)])
    return reduce_log_probs(tokens, executed_mask(ran, chunk_size), level)


def chunk_mask(extras: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """[T, B, K]: the actions of each transition's chunk that ran (None without chunks)."""
    chunks = chunk_results(extras)
    if chunks is None:
        return None
    action_rewards, executed = chunks
    return executed_mask(executed[1:], action_rewards.shape[-1])


def executed_mask(actions_executed: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[..., K] float: 1 for the actions of each chunk that ran."""
    positions = torch.arange(chunk_size, device=actions_executed.device)
    return (positions < actions_executed.unsqueeze(-1)).float()


def reduce_log_probs(log_probs: torch.Tensor, mask: torch.Tensor, logprob_type: str) -> torch.Tensor:
    """From per-token log-probs [T, B, K, ...] to the `logprob_type`'s shape.

    chunk_level: [T, B], the sum over the actions that ran and all their dimensions;
    action_level: [T, B, K], the sum over each action's dimensions;
    token_level: unchanged. Masking of the last two is the loss's (see `loss_mask`).
    """
    check_types("chunk_level", logprob_type)
    if logprob_type == "token_level":
        return log_probs
    per_action = log_probs.flatten(3).sum(-1) if log_probs.dim() > 3 else log_probs
    if logprob_type == "action_level":
        return per_action
    return (per_action * mask).sum(-1)


def loss_mask(valid: torch.Tensor, mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """The [T, B] transition mask, times the executed-action mask [T, B, K], broadcast to `shape`."""
    if len(shape) > 2 and mask is not None:
        valid = valid.unsqueeze(-1) * mask
    while valid.dim() < len(shape):
        valid = valid.unsqueeze(-1)
    return valid.expand(shape)


def align_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """[T, B] or [T, B, K] advantages, broadcast to log-probs of `shape`."""
    if advantages.dim() > len(shape):
        # With lambda = 1 the first action's advantage is exactly the chunk's K-step advantage.
        advantages = advantages[..., 0]
    while advantages.dim() < len(shape):
        advantages = advantages.unsqueeze(-1)
    return advantages.expand(shape)


@torch.no_grad()
def action_level_gae(action_rewards: torch.Tensor, actions_executed: torch.Tensor, discounts: torch.Tensor,
                     values: torch.Tensor, bootstrap_value: torch.Tensor, valid: torch.Tensor,
                     gamma: float, lambda_: float) -> GAEReturns:
    """GAE over the actions of every chunk, in order, as if each action were a step.

    action_rewards [T, B, K]; actions_executed [T, B]; discounts [T, B] (gamma, or 0 where
    the chunk's transition terminated); values [T, B]; bootstrap_value [B]; valid [T, B].

    The value function sees only the observation before each chunk, so V_t stands in for
    the value before each of chunk t's actions. After the chunk's last action that ran,
    the next value is V_{t+1} (with the chunk's discount); actions that never ran are
    masked. Returns advantages and value targets, [T, B, K].
    """
    T, B, K = action_rewards.shape
    mask = executed_mask(actions_executed, K)
    is_last = torch.arange(K, device=mask.device) == (actions_executed - 1).clamp(min=0).unsqueeze(-1)
    next_chunk_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    chunk_value = values.unsqueeze(-1).expand(T, B, K)
    next_values = torch.where(is_last, next_chunk_values.unsqueeze(-1), chunk_value)
    action_discounts = torch.where(is_last, discounts.unsqueeze(-1), torch.full_like(chunk_value, gamma))
    deltas = action_rewards + action_discounts * next_values - chunk_value

    def by_action(x: torch.Tensor) -> torch.Tensor:  # [T, B, K] -> [T*K, B], actions in time order
        return x.permute(0, 2, 1).reshape(T * K, B)

    advantages = discounted_backward_sum(by_action(deltas), by_action(action_discounts * lambda_),
                                         by_action(valid.unsqueeze(-1) * mask))
    advantages = advantages.reshape(T, K, B).permute(0, 2, 1)
    return GAEReturns(advantages=advantages, returns=advantages + chunk_value)
