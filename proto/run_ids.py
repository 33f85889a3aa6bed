"""Run ids: one random, nonzero id per env and per actor process.

The learner starts a new trajectory for an env slot whenever its run id changes, so a
restarted actor (or env) never continues an old unroll. 0 is reserved: the learner's
fresh slots hold it, so an env's first step always starts a trajectory.
"""

from __future__ import annotations

import secrets

import numpy as np


def new_run_ids(count: int) -> np.ndarray:
    """`count` fresh run ids, uint64, never 0."""
    return np.array([secrets.randbits(63) | 1 for _ in range(count)], np.uint64)
