"""The monitor thread: checks the stop conditions every 0.1 s and writes train summaries.

A short run writes often enough to draw curves: every uptime/100 s, at least every 1 s,
growing to `summary_interval_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fleetrl.learner.run.stop_conditions import StopConditions
from fleetrl.learner.run.summaries import TrainSummaries


class Monitor:
    def __init__(self, stop: threading.Event, stop_conditions: StopConditions, finish: Callable[[str], None],
                 summaries: TrainSummaries, summary_interval_s: float, started: float):
        self._stop, self._stop_conditions, self._finish = stop, stop_conditions, finish
        self._summaries, self._summary_interval_s, self._started = summaries, summary_interval_s, started
        self._thread = threading.Thread(target=self._loop, name="monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _loop(self) -> None:
        last_write = time.monotonic()
        while not self._stop.wait(0.1):
            reason = self._stop_conditions.reason_to_stop()
            if reason:
                self._finish(reason)
            now = time.monotonic()
            if now - last_write >= min(self._summary_interval_s, max(1.0, (now - self._started) / 100)):
                self._summaries.write()
                last_write = now
