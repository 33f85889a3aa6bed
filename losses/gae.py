"""Generalized advantage estimation (Schulman et al. 2016), time-major [T, B].

    delta_t = r_t + gamma_t * V_{t+1} - V_t
    A_t     = delta_t + gamma_t * lambda * A_{t+1},   A_T = 0
    R_t     = A_t + V_t

`discounts` (gamma_t) is zero where the episode terminated. `valid` (see
`fleetrl.losses.transitions`) zeroes the step from a final observation to the next
episode's reset, so A_t of the last real transition is its own delta_t: bootstrapped from
V(final observation) after a truncation, from nothing after a termination.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class GAEReturns:
    advantages: torch.Tensor  # [T, B]
    returns: torch.Tensor  # [T, B], the value targets A_t + V_t


@torch.no_grad()
def gae(rewards: torch.Tensor, discounts: torch.Tensor, values: torch.Tensor, bootstrap_value: torch.Tensor,
        lambda_: float, valid: torch.Tensor | None = None) -> GAEReturns:
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rewards + discounts * next_values - values
    trace = discounts * lambda_
    if valid is not None:
        deltas = deltas * valid
        trace = trace * valid
    advantage = torch.zeros_like(bootstrap_value)
    advantages = []
    for t in reversed(range(values.shape[0])):
        advantage = deltas[t] + trace[t] * advantage
        advantages.append(advantage)
    advantages = torch.stack(advantages[::-1], dim=0)
    return GAEReturns(advantages=advantages, returns=advantages + values)
