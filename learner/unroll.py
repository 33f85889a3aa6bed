"""The training batch: B unrolls of T+1 steps, time-major.

Consecutive unrolls of one env overlap by one step: the last step of one is the first of
the next, so every transition t -> t+1 is trained on exactly once and the last step's
value bootstraps the unroll.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch
from torch.utils import _pytree as pytree

# The per-step fields the learner records, besides observations ("obs/<name>") and
# actions ("action/<name>").
STEP_FIELDS: dict[str, torch.dtype] = {
    "first": torch.bool,
    "reward": torch.float32,
    "terminated": torch.bool,
    "truncated": torch.bool,
    "behaviour_log_prob": torch.float32,
    # The agent's "baseline" output at inference (0 for agents without one).
    "behaviour_value": torch.float32,
    "policy_version": torch.int64,
    # The step belongs to a teacher-forced episode: the oracle's action was executed.
    "teacher_forcing": torch.bool,
    # Which env slot and which of its episodes the step belongs to (GRPO groups by them).
    "slot": torch.int64,
    "episode_index": torch.int64,
}

# Recorded only for Problems with action chunks (fleetrl.envs.action_chunks): each action's
# reward, [K], and how many of the chunk's actions ran, for the transition that led to the step.
CHUNK_FIELDS: dict[str, torch.dtype] = {
    "action_rewards": torch.float32,
    "actions_executed": torch.int64,
}


@dataclasses.dataclass
class UnrollBatch:
    """Tensors are [T+1, B, ...]; `initial_state` is the agent state before step 0, [B, ...]."""

    observation: dict[str, torch.Tensor]
    action: dict[str, torch.Tensor]
    first: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    behaviour_log_prob: torch.Tensor
    behaviour_value: torch.Tensor
    policy_version: torch.Tensor
    teacher_forcing: torch.Tensor
    slot: torch.Tensor
    episode_index: torch.Tensor
    initial_state: Any
    # GRPO only: each step's episode return, normalized within its group.
    group_advantage: torch.Tensor | None = None
    # Action chunks only (see CHUNK_FIELDS): [T+1, B, K] and [T+1, B].
    action_rewards: torch.Tensor | None = None
    actions_executed: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.first.shape[1]

    @staticmethod
    def from_fields(fields: Mapping[str, torch.Tensor], initial_state: Any) -> "UnrollBatch":
        """From flat, batch-major [B, T+1, ...] fields as the state store emits them."""
        tm = {k: v.transpose(0, 1) for k, v in fields.items()}
        return UnrollBatch(
            observation={k[4:]: v for k, v in tm.items() if k.startswith("obs/")},
            action={k[7:]: v for k, v in tm.items() if k.startswith("action/")},
            initial_state=initial_state,
            group_advantage=tm.get("group_advantage"),
            **{k: tm.get(k) for k in CHUNK_FIELDS},
            **{k: tm[k] for k in STEP_FIELDS},
        )

    def select(self, index: torch.Tensor) -> "UnrollBatch":
        """The unrolls at `index` (along B)."""
        pick = lambda x: None if x is None else x[:, index]  # noqa: E731
        fields = {f.name: pytree.tree_map(pick, getattr(self, f.name))
                  for f in dataclasses.fields(self) if f.name != "initial_state"}
        return UnrollBatch(**fields, initial_state=pytree.tree_map(lambda s: s[index], self.initial_state))

    def to(self, device: torch.device | str) -> "UnrollBatch":
        move = lambda x: None if x is None else x.to(device, non_blocking=True)  # noqa: E731
        return UnrollBatch(**{f.name: pytree.tree_map(move, getattr(self, f.name)) for f in dataclasses.fields(self)})
