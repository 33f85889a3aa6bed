"""What the losses need of a Problem, as a protocol, so that losses never import problems.

`fleetrl.problems.base.Problem` satisfies it; so does any object with these members.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from fleetrl.losses.config import LossConfig


class TrainingProblem(Protocol):
    # The loss settings (a Problem's config extends LossConfig).
    config: LossConfig

    def action_log_prob(self, agent_output: Mapping[str, torch.Tensor],
                        actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[T, B] log-probs of `actions`; with action chunks, per token ([T, B, K] or [T, B, K, D])."""
        ...

    def teacher_forcing_log_prob(self, agent_output: Mapping[str, torch.Tensor],
                                 actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The log-probs that teacher forcing's cross-entropy maximizes, shaped as `action_log_prob`'s."""
        ...

    def entropy(self, agent_output: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The policy's entropy, in the shape of `action_log_prob`."""
        ...
