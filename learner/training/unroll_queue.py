"""The bounded queue between inference and training.

Its size is the learner's one memory bound on finished unrolls: when the trainer falls
behind, `put` blocks the inference thread, the actors wait for their actions, and so the
policy lag of queued data stays bounded by (queue size / batch size) trainer steps.
"""

from __future__ import annotations

import queue
import threading

from fleetrl.losses.batch import Unroll, UnrollBatch


class UnrollQueue:
    def __init__(self, capacity: int, stop: threading.Event):
        self._queue: queue.Queue[Unroll] = queue.Queue(maxsize=capacity)
        self._stop = stop

    def qsize(self) -> int:
        return self._queue.qsize()

    def put(self, unroll: Unroll) -> bool:
        """Blocks while full; returns False if the learner stopped meanwhile."""
        while not self._stop.is_set():
            try:
                self._queue.put(unroll, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get_batch(self, batch_size: int) -> UnrollBatch | None:
        """B unrolls stacked time-major, or None if the learner stopped first."""
        unrolls: list[Unroll] = []
        while len(unrolls) < batch_size:
            if self._stop.is_set():
                return None
            try:
                unrolls.append(self._queue.get(timeout=0.1))
            except queue.Empty:
                continue
        return UnrollBatch.collate(unrolls)
