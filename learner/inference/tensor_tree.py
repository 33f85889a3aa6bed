"""Per-env masks, broadcast against batched tensors."""

from __future__ import annotations

import torch


def expand_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [B] mask reshaped to broadcast against a [B, ...] tensor."""
    return mask.reshape(mask.shape + (1,) * (like.dim() - mask.dim()))
