"""PPO's per-state trust region (`max_state_kl`): no optimizer step may move any state of the
batch further than a KL bound from the policy that started the batch's updates.

PPO's clip and `target_kl` look at the sampled actions, averaged over the batch. A state
that appears a few times in a batch can flip its greedy action while both stay quiet: one
rare action's large gradient, through features it shares with that state, moved NumberLine's
first step at (5, 4) from p(right) 0.99 to 0.01 in one step (docs/notes/numberline_dips.md). TRPO's
bound is on the maximum KL over states (Schulman et al. 2015, section 4; TRPO itself then
uses the mean). This enforces the maximum over the batch's states, after the fact and
cheaply: after each step the whole batch is re-evaluated without gradients, and a step that
went past the bound is shortened by halves, as TRPO's line search does, until it does not.
The batch's remaining steps are then skipped.
"""

from __future__ import annotations

import dataclasses

import torch

from fleetrl.agents.base import Agent
from fleetrl.losses.batch import UnrollBatch
from fleetrl.losses.ppo import categorical_kl

# After this many halvings (a 64th of the step) the step is undone altogether.
MAX_HALVINGS = 6


@dataclasses.dataclass
class Shortening:
    max_state_kl: float  # the largest state KL after the (shortened) step
    step_fraction: float  # of the step kept: 1 whole, 0 undone

    def logs(self) -> dict[str, float]:
        return {"ppo/max_state_kl": self.max_state_kl, "ppo/step_fraction": self.step_fraction}


class StateTrustRegion:
    def __init__(self, agent: Agent, parameters: list[torch.nn.Parameter], max_kl: float):
        self.agent = agent
        self.parameters = parameters
        self.max_kl = max_kl

    @torch.no_grad()
    def start_batch(self, batch: UnrollBatch, before_logits: torch.Tensor, valid: torch.Tensor) -> None:
        """`before_logits`: [T+1, B, ...] from the policy before the batch's first step;
        `valid`: [T, B], the transitions the losses train on."""
        self.batch, self.before_logits, self.valid = batch, before_logits[:-1], valid > 0

    @torch.no_grad()
    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.parameters]

    @torch.no_grad()
    def enforce(self, before_step: list[torch.Tensor]) -> Shortening:
        """Shortens the step just taken from `before_step` until no state of the batch is past
        the bound; returns the largest state KL and the fraction of the step kept (0: undone)."""
        largest = self._largest_kl()
        if largest <= self.max_kl:
            return Shortening(largest, 1.0)
        after_step = self.weights()
        fraction = 1.0
        for _ in range(MAX_HALVINGS):
            fraction /= 2
            for p, before, after in zip(self.parameters, before_step, after_step):
                p.copy_(before + fraction * (after - before))
            largest = self._largest_kl()
            if largest <= self.max_kl:
                return Shortening(largest, fraction)
        for p, before in zip(self.parameters, before_step):
            p.copy_(before)
        return Shortening(self._largest_kl(), 0.0)

    def _largest_kl(self) -> float:
        batch = self.batch
        logits = self.agent.unroll(batch.observation, batch.first, batch.initial_state, batch.action)[0]
        kl = categorical_kl(self.before_logits, logits["policy_logits"][:-1])
        return float(torch.where(self.valid, kl, torch.zeros_like(kl)).max())
