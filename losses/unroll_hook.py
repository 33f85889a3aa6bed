"""The one place where finished unrolls may be held or rewritten before the trainer sees them.

An algorithm supplies a hook (`Algorithm.unroll_hook`); the base class passes every unroll
straight through. GRPO's hook (`fleetrl.losses.group_advantages`) holds each unroll until
the group returns of its episodes are known, then adds them as a per-step extra.

The learner calls `process` on its inference thread, and `admit`, `actor_joined` and
`actor_left` from actor stream threads: a hook that keeps state guards it with a lock.
"""

from __future__ import annotations

import numpy as np

from fleetrl.losses.batch import Unroll


class UnrollHook:
    # A train actor's num_envs must be a multiple of this (told to clients in RunInfo).
    num_envs_multiple: int = 1

    def admit(self, num_envs: int) -> str | None:
        """Why a train actor with `num_envs` envs cannot join (None: it can)."""
        return None

    def actor_joined(self, slots: np.ndarray) -> None:
        """A train actor joined; its envs hold `slots`, in env-index order."""

    def actor_left(self, slots: np.ndarray) -> None:
        """A train actor left: its slots will be reused, so drop whatever waits on them."""

    def process(self, unroll: Unroll) -> list[Unroll]:
        """The unrolls ready for the trainer now: this one, none (held), or several (released)."""
        return [unroll]
