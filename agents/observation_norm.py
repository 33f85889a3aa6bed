"""Per-pixel image normalization with running statistics, kept by the learner.

Each pixel and channel is standardized by the mean and variance of every training image
seen so far (as Sample Factory's and Stable Baselines' observation normalizers do). Where
the images of a task are nearly the same in every state (NumberLine's differ only in two
digits), this leaves the agent only the pixels that vary. Per-image standardization leaves
the shared background and text in, and there a converged policy's features kept collapsing
(docs/notes/numberline_dips.md).

The statistics are buffers: they travel with checkpoints and eval copies. Only
`update` changes them, and the trainer calls it once per batch under the policy lock
(`Agent.update_statistics`), so inference and training always read the same statistics
and the T=1 and T>1 paths stay identical.
"""

from __future__ import annotations

import torch
from torch import nn


class RunningImageNorm(nn.Module):
    def __init__(self, height: int, width: int, channels: int = 3, min_std: float = 8.0, clip: float = 5.0):
        """`min_std` (in pixel values, 0-255) keeps pixels that never change at 0 instead of
        dividing by ~0; `clip` bounds pixels that rarely change (a digit's stroke), which
        would otherwise stand out by tens of standard deviations."""
        super().__init__()
        self.min_std, self.clip = min_std, clip
        # Before any statistics: about [-1, 1] for 0-255 pixels. The first update replaces them.
        self.register_buffer("mean", torch.full((channels, height, width), 127.5, dtype=torch.float64))
        self.register_buffer("var", torch.full((channels, height, width), 127.5**2, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, images: torch.Tensor) -> None:
        """Adds [N, H, W, C] images to the statistics (Chan et al.'s parallel combination,
        in float64 so that millions of images do not drift)."""
        batch = images.reshape(-1, *images.shape[-3:]).permute(0, 3, 1, 2).double()
        n = batch.shape[0]
        if n == 0:
            return
        mean, var = batch.mean(0), batch.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.var.copy_((self.var * self.count + var * n + delta**2 * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """[N, H, W, C] images (uint8 or float) -> [N, C, H, W] standardized floats."""
        image = images.permute(0, 3, 1, 2).float()
        std = self.var.float().sqrt().clamp(min=self.min_std)
        return ((image - self.mean.float()) / std).clamp(-self.clip, self.clip)
