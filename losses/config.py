"""Every loss setting, in one flat dataclass that each Problem's config extends.

Flat, so that any of them can be set with --hparams (for example
`--hparams=algorithm=ppo,clip_eps_high=0.28,epochs=4`). Each algorithm reads the fields
it documents and ignores the rest.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LossConfig:
    # The training algorithm, by registered name: vtrace, ppo, grpo, supervised
    # (see fleetrl.losses.algorithms).
    algorithm: str = "vtrace"
    discount: float = 0.99
    entropy_cost: float = 0.01
    # The value loss's weight (V-trace's baseline cost, PPO's c_v).
    baseline_cost: float = 0.5

    # V-trace.
    rho_bar: float = 1.0
    c_bar: float = 1.0
    pg_rho_bar: float = 1.0
    lambda_: float = 1.0

    # PPO and GAE.
    gae_lambda: float = 0.95
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    # > 1 caps the loss of negative-advantage steps whose ratio exploded; None: off.
    dual_clip: float | None = None
    # None: no value clipping.
    value_clip_eps: float | None = None
    # None: squared value error; else the Huber loss with this delta.
    value_huber_delta: float | None = None
    normalize_advantages: bool = True

    # Action chunks (Problems with chunk_size > 1; see fleetrl.losses.chunks):
    # reward_type chunk_level | action_level; logprob_type chunk_level | action_level | token_level.
    # V-trace takes chunk_level only; PPO takes every pair; GRPO ignores reward_type.
    reward_type: str = "chunk_level"
    logprob_type: str = "chunk_level"

    # GRPO: envs per group. A group's members start each episode from the same reset seed,
    # and each episode's advantage is its return normalized within the group.
    group_size: int = 1

    # Passes over each batch of unrolls: epochs of `minibatches` minibatches (split across
    # unrolls, so recurrent agents keep whole unrolls). None: the algorithm's default
    # (V-trace and GRPO 1 x 1, PPO 4 x 4).
    epochs: int | None = None
    minibatches: int | None = None
