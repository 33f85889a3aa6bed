"""The actors with a handshaken stream open: each one's mode, and the pace of its steps.

The service adds an actor at its handshake and removes it when its stream ends; the
inference batchers ask how many streams of their mode are stepping, so that a batch holding
a step from each of them flushes at once (see `InferenceBatcher`). It is built before both,
so neither reaches into the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ConnectedActors:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._modes: dict[str, int] = {}  # actor id -> its mode (pb.TRAIN or pb.EVAL)
        self._last_step: dict[str, tuple[float, float]] = {}  # actor id -> (its last step's time, the interval before)

    def __len__(self) -> int:
        with self._lock:
            return len(self._modes)

    def join(self, actor: str, mode: int) -> bool:
        """Adds `actor`; False, changing nothing, when an actor of that id is connected already."""
        with self._lock:
            if actor in self._modes:
                return False
            self._modes[actor] = mode
            return True

    def leave(self, actor: str) -> None:
        with self._lock:
            self._modes.pop(actor, None)
            self._last_step.pop(actor, None)

    def mode_of(self, actor: str) -> int | None:
        with self._lock:
            return self._modes.get(actor)

    def stepped(self, actor: str) -> None:
        now = self._clock()
        with self._lock:
            last = self._last_step.get(actor)
            self._last_step[actor] = (now, now - last[0] if last else 0.0)

    def stepping(self, mode: int) -> int:
        """Actors connected in `mode` whose next step a batch may wait for (each has at most one
        step in inference): those that have sent a step and have not gone quiet for over twice
        their last interval between steps plus a second. An actor that handshakes and then sends
        nothing, or stops sending, must not make every batch of the others wait out the timeout."""
        now = self._clock()
        with self._lock:
            return sum(1 for actor, m in self._modes.items() if m == mode and actor in self._last_step
                       and now - self._last_step[actor][0] <= 2 * self._last_step[actor][1] + 1.0)
