"""The PPO loss: clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization
Algorithms"), optional dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games
with Deep Reinforcement Learning") and value clipping.

    ratio = exp(log pi - log pi_old)
    L_pi  = mean(max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)))
    dual clip (Ye et al. 2020), for A < 0 only: L_pi = min(L_pi, -dual_clip * A)
    V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
    L_V   = 0.5 * mean(max((R - V)^2, (R - V_clip)^2))     (Huber instead of squares: optional)
    anchor: KL(pi_before || pi) over each state's whole action distribution (optional)
    total = L_pi + baseline_cost * L_V - entropy_cost * H + anchor_kl_cost * anchor

Means run over valid transitions only (`valid` masks the autoreset step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fleetrl.losses.config import LossConfig
from fleetrl.losses.explained_variance import explained_variance

# The mean approximate KL (Schulman's k3 estimator) from the policy that acted, among the logs.
APPROX_KL = "ppo/approx_kl"


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def categorical_kl(before_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(before || now) per step: logits [T, B, ..., A]; dims past [T, B] are summed (the
    actions of a chunk)."""
    kl = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=before_logits.detach()),
                                           torch.distributions.Categorical(logits=logits))
    return kl.reshape(*kl.shape[:2], -1).sum(-1)


def ppo_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
             values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, entropy: torch.Tensor,
             valid: torch.Tensor, config: LossConfig, value_valid: torch.Tensor | None = None,
             entropy_valid: torch.Tensor | None = None,
             anchor_kl: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Inputs are [T, B] per transition, or finer with action chunks: the policy terms take
    the shape of `log_probs` and `valid`, the value terms that of `returns` and
    `value_valid`, the entropy and `anchor_kl` (`categorical_kl`) that of `entropy` and
    `entropy_valid` (both default to `valid`). Advantages, returns and the old values carry
    no gradient."""
    value_valid = valid if value_valid is None else value_valid
    entropy_valid = valid if entropy_valid is None else entropy_valid
    mean = masked_mean(advantages, valid)
    std = masked_mean((advantages - mean) ** 2, valid).sqrt()
    if config.normalize_advantages:
        advantages = (advantages - mean) / (std + 1e-8)
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - config.clip_eps_low, 1 + config.clip_eps_high)
    policy_losses = torch.maximum(-advantages * ratio, -advantages * clipped)
    if config.dual_clip is not None:
        capped = torch.minimum(policy_losses, -config.dual_clip * advantages)
        policy_losses = torch.where(advantages < 0, capped, policy_losses)
    policy_loss = masked_mean(policy_losses, valid)

    def value_error(prediction: torch.Tensor) -> torch.Tensor:
        if config.value_huber_delta is None:
            return (returns - prediction) ** 2
        return 2 * F.huber_loss(prediction, returns, reduction="none", delta=config.value_huber_delta)

    value_errors = value_error(values)
    if config.value_clip_eps is not None:
        clipped_values = old_values + torch.clamp(values - old_values, -config.value_clip_eps, config.value_clip_eps)
        value_errors = torch.maximum(value_errors, value_error(clipped_values))
    value_loss = 0.5 * masked_mean(value_errors, value_valid)
    mean_entropy = masked_mean(entropy, entropy_valid)
    total = policy_loss + config.baseline_cost * value_loss - config.entropy_cost * mean_entropy
    if anchor_kl is not None:
        mean_anchor_kl = masked_mean(anchor_kl, entropy_valid)
        total = total + config.anchor_kl_cost * mean_anchor_kl

    with torch.no_grad():
        logs = {
            "loss/total": total.detach(),
            "loss/policy": policy_loss.detach(),
            "loss/value": value_loss.detach(),
            "policy/entropy": mean_entropy.detach(),
            "policy/advantage_std": std,  # before normalization: how much signal the batch carries
            APPROX_KL: masked_mean((ratio - 1) - log_ratio, valid),
            "ppo/clip_fraction": masked_mean(((ratio < 1 - config.clip_eps_low) |
                                              (ratio > 1 + config.clip_eps_high)).float(), valid),
            # One rare action whose probability jumped, which the mean KL cannot tell from a broad shift.
            "ppo/ratio_max": torch.where(valid > 0, ratio, torch.zeros_like(ratio)).max(),
            "value/explained_variance": explained_variance(old_values, returns, value_valid),
        }
        if anchor_kl is not None:
            logs["ppo/anchor_kl"] = mean_anchor_kl.detach()
    return total, logs
