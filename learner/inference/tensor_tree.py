"""Small helpers for pytrees of tensors and per-env masks."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree


def tree_to(tree: Any, device: torch.device | str) -> Any:
    return pytree.tree_map(lambda x: x.to(device), tree)


def expand_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [B] mask reshaped to broadcast against a [B, ...] tensor."""
    return mask.reshape(mask.shape + (1,) * (like.dim() - mask.dim()))
