"""V-trace off-policy targets and the IMPALA actor-critic loss.

Definitions follow Espeholt et al. (2018), "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures", and deepmind/scalable_agent's
`vtrace.py`. Arrays are time-major [T, B].

With c_t = lambda * min(c_bar, rho_t) and delta_t = min(rho_bar, rho_t) * (r_t + gamma_t V_{t+1} - V_t):

    vs_t = V_t + delta_t + gamma_t * c_t * (vs_{t+1} - V_{t+1}),   vs_T = V_T (bootstrap)
    pg_adv_t = min(pg_rho_bar, rho_t) * (r_t + gamma_t * vs_{t+1} - V_t)

`valid` (optional, 1 or 0 per transition) extends the paper's definition for Gymnasium's autoreset:
an invalid transition has no TD error and cuts the trace, so vs_t = V_t there and the
preceding transition bootstraps from V_t itself (see `fleetrl.losses.transitions`).
"""

from __future__ import annotations

import dataclasses

import torch

from fleetrl.losses.backward_scan import discounted_backward_sum
from fleetrl.losses.config import LossConfig
from fleetrl.losses.explained_variance import explained_variance


@dataclasses.dataclass
class VTraceReturns:
    vs: torch.Tensor  # [T, B] value targets
    pg_advantages: torch.Tensor  # [T, B] policy-gradient advantages


@torch.no_grad()
def vtrace_returns(log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
                   values: torch.Tensor, bootstrap_value: torch.Tensor, rho_bar: float = 1.0,
                   c_bar: float = 1.0, pg_rho_bar: float = 1.0, lambda_: float = 1.0,
                   valid: torch.Tensor | None = None) -> VTraceReturns:
    """V-trace targets. Inputs are [T, B] except bootstrap_value [B]; outputs carry no gradient."""
    rhos = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = lambda_ * torch.clamp(rhos, max=c_bar)
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    # vs_t - V_t = delta_t + gamma_t c_t (vs_{t+1} - V_{t+1})
    vs = values + discounted_backward_sum(deltas, discounts * cs, valid)

    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_advantages = torch.clamp(rhos, max=pg_rho_bar) * (rewards + discounts * next_vs - values)
    if valid is not None:
        pg_advantages = pg_advantages * valid
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def vtrace_loss(target_log_probs: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor,
                behaviour_log_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor,
                valid: torch.Tensor, config: LossConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The IMPALA loss over T transitions.

    target_log_probs, entropy, behaviour_log_probs and values are [T+1, B] (one per step of
    the unroll); rewards, discounts and valid are [T, B]. Losses are averaged over the T*B
    transitions (as SEED RL does) rather than summed, so the learning rate does not depend
    on the unroll length or batch size.
    """
    log_rhos = (target_log_probs[:-1] - behaviour_log_probs[:-1]).detach()
    returns = vtrace_returns(
        log_rhos, discounts, rewards, values[:-1].detach(), values[-1].detach(),
        rho_bar=config.rho_bar, c_bar=config.c_bar, pg_rho_bar=config.pg_rho_bar,
        lambda_=config.lambda_, valid=valid,
    )
    count = valid.numel()
    policy_loss = -(target_log_probs[:-1] * returns.pg_advantages).sum() / count
    baseline_loss = 0.5 * ((returns.vs - values[:-1]) ** 2 * valid).sum() / count
    mean_entropy = (entropy[:-1] * valid).sum() / count
    total = policy_loss + config.baseline_cost * baseline_loss - config.entropy_cost * mean_entropy
    logs = {
        "loss/total": total.detach(),
        "loss/policy": policy_loss.detach(),
        "loss/baseline": baseline_loss.detach(),
        "policy/entropy": mean_entropy.detach() * count / valid.sum().clamp(min=1),
        "policy/mean_rho": (torch.exp(log_rhos) * valid).sum() / valid.sum().clamp(min=1),
        # The policy gradient's scale beside the entropy bonus's: unnormalized, it grows with the returns.
        "policy/mean_abs_advantage": returns.pg_advantages.abs().sum() / valid.sum().clamp(min=1),
        "value/mean_target": (returns.vs * valid).sum() / valid.sum().clamp(min=1),
        "value/explained_variance": explained_variance(values[:-1].detach(), returns.vs, valid),
    }
    return total, logs
