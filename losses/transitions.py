"""Turns an unroll of T+1 steps into T transitions, with episode ends handled exactly.

Actors use Gymnasium's next-step autoreset: when an episode ends at step t, the actor
sends the final observation x_t with its reward and `terminated` / `truncated` flags. The
learner still picks an action there (the env ignores it), and step t+1 is the reset
observation of the next episode, with reward 0 and `first` set.

So for the transition t -> t+1 of an unroll:
- reward = reward[t+1], the reward received on arriving at x_{t+1};
- discount = gamma * (1 - terminated[t+1]): a true end bootstraps nothing, while a
  time-limit truncation bootstraps from V(x_{t+1}), the value of the final observation;
- valid = not (terminated[t] or truncated[t]): the step from a final observation to the
  next episode's reset observation is not a transition of any episode, and is masked.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Transitions:
    rewards: torch.Tensor  # [T, B]
    discounts: torch.Tensor  # [T, B]
    valid: torch.Tensor  # [T, B] float, 1 for real transitions


def transitions(reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                discount: float) -> Transitions:
    """Transitions from step-aligned [T+1, B] reward and flags (see the module docstring)."""
    ended = terminated | truncated
    return Transitions(
        rewards=reward[1:].float(),
        discounts=discount * (~terminated[1:]).float(),
        valid=(~ended[:-1]).float(),
    )
