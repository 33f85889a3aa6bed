"""The standard VLN metrics of one episode, on a scan's graph distances.

Definitions follow R2R's `eval.py`, google-research `r4r/cls.py` and `r4r/dtw.py` (see
the metric table in the R2R reference): PL, NE, SR, OSR, SPL, CLS, nDTW, SDTW. `distance`
is any callable d(a, b) giving shortest-path metres between viewpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Distance = Callable[[str, str], float]
# An episode succeeds when it stops within this many metres of the goal.
SUCCESS_DISTANCE_M = 3.0
METRIC_NAMES = ("PL", "NE", "SR", "OSR", "SPL", "CLS", "nDTW", "SDTW")


def collapse_repeats(path: Sequence[str]) -> list[str]:
    """The path without consecutive repeats (an agent that stays put did not move)."""
    return [node for i, node in enumerate(path) if i == 0 or node != path[i - 1]]


def path_length(path: Sequence[str], distance: Distance) -> float:
    return float(sum(distance(a, b) for a, b in zip(path[:-1], path[1:])))


def dtw(prediction: Sequence[str], reference: Sequence[str], distance: Distance) -> float:
    """Dynamic time warping between the two node sequences, with graph distance as the cost."""
    table = np.full((len(prediction) + 1, len(reference) + 1), np.inf)
    table[0, 0] = 0.0
    for i, p in enumerate(prediction, 1):
        for j, r in enumerate(reference, 1):
            table[i, j] = distance(p, r) + min(table[i - 1, j], table[i, j - 1], table[i - 1, j - 1])
    return float(table[-1, -1])


def ndtw(prediction: Sequence[str], reference: Sequence[str], distance: Distance,
         threshold: float = SUCCESS_DISTANCE_M) -> float:
    return math.exp(-dtw(prediction, reference, distance) / (len(reference) * threshold))


def cls(prediction: Sequence[str], reference: Sequence[str], distance: Distance,
        threshold: float = SUCCESS_DISTANCE_M) -> float:
    """Coverage weighted by length score (Jain et al. 2019)."""
    coverage = float(np.mean([math.exp(-min(distance(r, p) for p in prediction) / threshold) for r in reference]))
    expected = coverage * path_length(reference, distance)
    predicted = path_length(prediction, distance)
    denominator = expected + abs(expected - predicted)
    if denominator == 0:  # both lengths zero: VALAN scores it 1
        return 1.0
    return coverage * expected / denominator


def episode_metrics(prediction: Sequence[str], reference: Sequence[str], distance: Distance,
                    threshold: float = SUCCESS_DISTANCE_M) -> dict[str, float]:
    """All metrics of one episode: `prediction` is the agent's viewpoints from the start,
    `reference` the instruction's path (start first, goal last)."""
    if not prediction or not reference:
        raise ValueError("episode_metrics needs non-empty prediction and reference paths")
    path = collapse_repeats(prediction)
    goal = reference[-1]
    length = path_length(path, distance)
    error = distance(path[-1], goal)
    success = float(error < threshold)
    shortest = distance(reference[0], goal)
    normalized_dtw = ndtw(path, reference, distance, threshold)
    return {
        "PL": length,
        "NE": error,
        "SR": success,
        "OSR": float(min(distance(p, goal) for p in path) < threshold),
        "SPL": success * shortest / max(length, shortest) if max(length, shortest) > 0 else success,
        "CLS": cls(path, reference, distance, threshold),
        "nDTW": normalized_dtw,
        "SDTW": success * normalized_dtw,
    }
