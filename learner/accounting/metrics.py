"""Thread-safe metric accumulation for summaries and the progress display.

`ScalarMeans` averages values between two reads (one TensorBoard write interval).
`EpisodeWindow` keeps the last N finished episodes for "mean return of recent episodes".
`RateMeter` turns a growing counter into a rate over a short sliding window.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Iterable, Mapping


class ScalarMeans:
    def __init__(self):
        self._lock = threading.Lock()
        self._sums: dict[str, float] = collections.defaultdict(float)
        self._counts: dict[str, int] = collections.defaultdict(int)
        # name -> [count, sum, sum of squares, min, max] of each observation's value
        self._spreads: dict[str, list[float]] = {}

    def add(self, name: str, value: float, count: int = 1) -> None:
        """Adds `count` observations whose mean is `value`."""
        with self._lock:
            self._sums[name] += float(value) * count
            self._counts[name] += count

    def add_all(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.add(name, value)

    def add_with_spread(self, name: str, value: float) -> None:
        """An observation whose mean and also min, max and std the drain reports (as
        name, name_min, name_max, name_std): an episode's return, say."""
        value = float(value)
        with self._lock:
            spread = self._spreads.setdefault(name, [0, 0.0, 0.0, math.inf, -math.inf])
            spread[0] += 1
            spread[1] += value
            spread[2] += value * value
            spread[3], spread[4] = min(spread[3], value), max(spread[4], value)

    def drain(self) -> dict[str, float]:
        """The means (and spreads) since the last drain, and a reset."""
        with self._lock:
            means = {k: self._sums[k] / self._counts[k] for k in self._sums if self._counts[k]}
            for name, (count, total, squares, low, high) in self._spreads.items():
                mean = total / count
                means.update({name: mean, f"{name}_min": low, f"{name}_max": high,
                              f"{name}_std": math.sqrt(max(squares / count - mean * mean, 0.0))})
            self._sums.clear()
            self._counts.clear()
            self._spreads.clear()
            return means


class EpisodeWindow:
    def __init__(self, size: int = 100):
        self._lock = threading.Lock()
        self._episodes: collections.deque[Mapping[str, float]] = collections.deque(maxlen=size)
        self.total = 0

    def extend(self, episodes: Iterable[Mapping[str, float]]) -> None:
        with self._lock:
            for episode in episodes:
                self._episodes.append(dict(episode))
                self.total += 1

    def mean(self, metric: str) -> float:
        """The mean over the window's episodes that report `metric`; NaN if none do."""
        with self._lock:
            values = [e[metric] for e in self._episodes if metric in e]
        return sum(values) / len(values) if values else math.nan

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)

    def count(self, metric: str) -> int:
        """How many of the window's episodes report `metric` (what `mean` averages)."""
        with self._lock:
            return sum(metric in e for e in self._episodes)

    def recent(self) -> list[dict[str, float]]:
        """The window's episodes, oldest first: what a checkpoint keeps of it."""
        with self._lock:
            return [dict(e) for e in self._episodes]

    def restore(self, episodes: Iterable[Mapping[str, float]], total: int) -> None:
        """A resumed run's window and count, as `recent` and `total` were when it was saved."""
        with self._lock:
            self._episodes.clear()
            self._episodes.extend(dict(e) for e in episodes)
            self.total = total


class RateMeter:
    def __init__(self, window_s: float = 10.0):
        self._window_s = window_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self._lock = threading.Lock()

    def rate(self, count: float, now: float | None = None) -> float:
        """Records `count` at `now` and returns the count's growth per second over the window."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._samples.append((now, count))
            while len(self._samples) > 2 and now - self._samples[0][0] > self._window_s:
                self._samples.popleft()
            (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
            return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
