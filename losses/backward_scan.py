"""The backward recursion that V-trace and GAE share."""

from __future__ import annotations

import torch


def discounted_backward_sum(deltas: torch.Tensor, factors: torch.Tensor,
                            valid: torch.Tensor | None = None) -> torch.Tensor:
    """acc_t = delta_t + factor_t * acc_{t+1}, from acc_T = 0, over [T, B] inputs.

    Where `valid` is 0 the transition adds nothing and cuts the recursion, so acc_t = 0
    there and nothing after it reaches the steps before it.
    """
    if valid is not None:
        deltas, factors = deltas * valid, factors * valid
    acc = torch.zeros_like(deltas[0])
    out = []
    for t in reversed(range(deltas.shape[0])):
        acc = deltas[t] + factors[t] * acc
        out.append(acc)
    return torch.stack(out[::-1], dim=0)
