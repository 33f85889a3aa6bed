"""Bounded continuous action distributions for Gaussian policies.

An env's Box action space has bounds [low, high]. Two ways to respect them, each with an
exact log-prob of the action the env actually receives:

- `squashed_normal`: a = low + (tanh(u) + 1) * (high - low) / 2 with u ~ N(mean, std);
  the log-prob includes the change of variables (torch's TransformedDistribution).
- `ClippedNormal`: a = clip(u, low, high). The bounds carry the probability mass of the
  tails, so log p(a) = log CDF(low) at a = low and log (1 - CDF(high)) at a = high
  (Fujita & Maeda 2018); inside, the Normal density.

Both sum over action dimensions (an independent Gaussian per dimension), so `log_prob`
and `entropy` return one value per batch entry; `log_prob_per_dimension` and
`entropy_per_dimension` keep the last dimension (token-level log-probs of action chunks).
Entropy is the base Normal's: the squashed one has no closed form.
"""

from __future__ import annotations

import torch
from torch.distributions import AffineTransform, Distribution, Normal, TanhTransform, TransformedDistribution

# Actions exactly at a tanh bound have an infinite inverse; keep them this far inside.
_EDGE = 1e-6


class BoundedNormal(Distribution):
    """An independent Normal per action dimension, mapped into [low, high] by a subclass's
    `log_prob_per_dimension`, `sample` and `mode`; log-probs and entropy sum over dimensions."""

    arg_constraints: dict = {}

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, low: torch.Tensor, high: torch.Tensor):
        self.base = Normal(mean, std)
        self.low, self.high = low, high
        super().__init__(mean.shape[:-1], mean.shape[-1:], validate_args=False)

    def log_prob_per_dimension(self, value: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.log_prob_per_dimension(value).sum(-1)

    def entropy_per_dimension(self) -> torch.Tensor:
        return self.base.entropy()

    def entropy(self) -> torch.Tensor:
        return self.entropy_per_dimension().sum(-1)


class SquashedNormal(BoundedNormal):
    has_rsample = True

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, low: torch.Tensor, high: torch.Tensor):
        super().__init__(mean, std, low, high)
        self._squashed = TransformedDistribution(
            self.base, [TanhTransform(cache_size=1), AffineTransform((high + low) / 2, (high - low) / 2)])

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return self._squashed.sample(sample_shape)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return self._squashed.rsample(sample_shape)

    @property
    def mode(self) -> torch.Tensor:
        return (self.high + self.low) / 2 + (self.high - self.low) / 2 * torch.tanh(self.base.mean)

    def log_prob_per_dimension(self, value: torch.Tensor) -> torch.Tensor:
        margin = (self.high - self.low) / 2 * _EDGE
        value = torch.maximum(torch.minimum(value, self.high - margin), self.low + margin)
        return self._squashed.log_prob(value)


class ClippedNormal(BoundedNormal):
    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            return torch.maximum(torch.minimum(self.base.sample(sample_shape), self.high), self.low)

    @property
    def mode(self) -> torch.Tensor:
        return torch.maximum(torch.minimum(self.base.mean, self.high), self.low)

    def log_prob_per_dimension(self, value: torch.Tensor) -> torch.Tensor:
        z_low = (self.low - self.base.mean) / self.base.stddev
        z_high = (self.high - self.base.mean) / self.base.stddev
        inside = self.base.log_prob(value)
        below = torch.special.log_ndtr(z_low)
        above = torch.special.log_ndtr(-z_high)
        return torch.where(value <= self.low, below, torch.where(value >= self.high, above, inside))


BOUNDED_NORMALS: dict[str, type[BoundedNormal]] = {"tanh": SquashedNormal, "clip": ClippedNormal}
SQUASHES = tuple(BOUNDED_NORMALS)


def bounded_normal(kind: str, mean: torch.Tensor, log_std: torch.Tensor, low, high) -> BoundedNormal:
    """`kind` names the squashing: "tanh" (SquashedNormal) or "clip" (ClippedNormal)."""
    if kind not in BOUNDED_NORMALS:
        raise ValueError(f"unknown action squashing {kind!r}; use {' or '.join(SQUASHES)}")
    low = torch.as_tensor(low, dtype=mean.dtype, device=mean.device)
    high = torch.as_tensor(high, dtype=mean.dtype, device=mean.device)
    return BOUNDED_NORMALS[kind](mean, log_std.clamp(-20, 2).exp(), low, high)
