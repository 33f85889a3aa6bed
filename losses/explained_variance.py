"""How much of the value targets' variance the value function explains, for the summaries."""

from __future__ import annotations

import torch


@torch.no_grad()
def explained_variance(values: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """1 - Var(targets - values) / Var(targets) over the valid transitions: 1 is a perfect
    value function, 0 one no better than a constant, below 0 a harmful one."""
    def variance(x: torch.Tensor) -> torch.Tensor:
        count = valid.sum().clamp(min=1)
        mean = (x * valid).sum() / count
        return (((x - mean) ** 2) * valid).sum() / count

    return 1 - variance(targets - values) / variance(targets).clamp(min=1e-8)
