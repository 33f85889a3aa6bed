"""The training data the losses consume: one env's unroll, and a time-major batch of them.

An unroll holds T+1 consecutive steps of one env. Consecutive unrolls of an env overlap by
one step: the last step of one is the first of the next, so every transition t -> t+1 is
trained on exactly once and the last step's value bootstraps the unroll.

Each step records the core fields below, the observation ("obs/<name>"), the action taken
("action/<name>"), and the extras ("extra/<name>"): per-step fields of features, which
actors send beside observations (`Problem.extra_specs`, say action chunks' per-action
rewards) or which an algorithm's unroll hook adds (GRPO's group advantages). The losses
read extras by name, `batch.extras["action_rewards"]`; the learner never looks inside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

OBSERVATION = "obs/"
ACTION = "action/"
EXTRA = "extra/"

# The per-step fields every unroll records, besides observations, actions and extras.
STEP_FIELDS: dict[str, torch.dtype] = {
    # The step starts an episode: the agent's state was reset before it.
    "first": torch.bool,
    # The reward and flags of the transition that led to this step's observation.
    "reward": torch.float32,
    "terminated": torch.bool,
    "truncated": torch.bool,
    # The log-prob of the action taken, under the policy that chose it (per token with
    # action chunks: the algorithm reduces it, see fleetrl.losses.chunks).
    "behaviour_log_prob": torch.float32,
    # The agent's "baseline" output at inference (0 for agents without one).
    "behaviour_value": torch.float32,
    # The learner's optimizer steps when the action was chosen.
    "policy_version": torch.int64,
}


@dataclasses.dataclass
class Unroll:
    """T+1 steps of one env, as the learner's state store emits them."""

    slot: int  # the env's slot on the learner
    run_id: int  # the actor's run id of the env (a new one starts a new trajectory)
    index: int  # 0 for the first unroll of this run in this slot, then 1, 2, ... (each overlaps the last)
    steps: dict[str, torch.Tensor]  # field -> [T+1, ...]
    initial_state: Any  # the agent state before step 0, [1, ...] leaves

    @property
    def extras(self) -> dict[str, torch.Tensor]:
        return {k[len(EXTRA):]: v for k, v in self.steps.items() if k.startswith(EXTRA)}

    def add_extra(self, name: str, value: torch.Tensor) -> None:
        """Adds a per-step field ([T+1, ...]) that reaches the loss as batch.extras[name]."""
        self.steps[EXTRA + name] = value


@dataclasses.dataclass
class UnrollBatch:
    """Tensors are [T+1, B, ...]; `initial_state` is the agent state before step 0, [B, ...]."""

    observation: dict[str, torch.Tensor]
    action: dict[str, torch.Tensor]
    extras: dict[str, torch.Tensor]
    first: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    behaviour_log_prob: torch.Tensor
    behaviour_value: torch.Tensor
    policy_version: torch.Tensor
    initial_state: Any

    @property
    def batch_size(self) -> int:
        return self.first.shape[1]

    @staticmethod
    def from_fields(fields: Mapping[str, torch.Tensor], initial_state: Any) -> UnrollBatch:
        """From flat, batch-major [B, T+1, ...] fields."""
        tm = {k: v.transpose(0, 1) for k, v in fields.items()}

        def prefixed(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in tm.items() if k.startswith(prefix)}

        return UnrollBatch(observation=prefixed(OBSERVATION), action=prefixed(ACTION), extras=prefixed(EXTRA),
                           initial_state=initial_state, **{k: tm[k] for k in STEP_FIELDS})

    @staticmethod
    def collate(unrolls: Sequence[Unroll]) -> UnrollBatch:
        """Stacks unrolls into one time-major batch."""
        fields = {k: torch.stack([u.steps[k] for u in unrolls]) for k in unrolls[0].steps}
        state: Any = pytree.tree_map(lambda *xs: torch.cat(xs), *[u.initial_state for u in unrolls])
        return UnrollBatch.from_fields(fields, state)

    def select(self, index: torch.Tensor) -> UnrollBatch:
        """The unrolls at `index` (along B)."""
        return self._map(lambda x: x[:, index], lambda s: s[index])

    def to(self, device: torch.device | str) -> UnrollBatch:
        move = lambda x: x.to(device, non_blocking=True)  # noqa: E731
        return self._map(move, move)

    def _map(self, per_step, per_state) -> UnrollBatch:
        fields = {f.name: pytree.tree_map(per_step, getattr(self, f.name))
                  for f in dataclasses.fields(self) if f.name != "initial_state"}
        return UnrollBatch(**fields, initial_state=pytree.tree_map(per_state, self.initial_state))
