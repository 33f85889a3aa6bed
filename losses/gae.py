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

from fleetrl.losses.backward_scan import discounted_backward_sum


@dataclasses.dataclass
class GAEReturns:
    advantages: torch.Tensor  # [T, B]
    returns: torch.Tensor  # [T, B], the value targets A_t + V_t


@torch.no_grad()
def gae(rewards: torch.Tensor, discounts: torch.Tensor, values: torch.Tensor, bootstrap_value: torch.Tensor,
        lambda_: float, valid: torch.Tensor | None = None) -> GAEReturns:
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rewards + discounts * next_values - values
    advantages = discounted_backward_sum(deltas, discounts * lambda_, valid)
    return GAEReturns(advantages=advantages, returns=advantages + values)
