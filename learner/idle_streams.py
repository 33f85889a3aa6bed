"""Ends actor streams that go silent: one watchdog thread for all of them.

A stream is armed with its timeout once it has been answered (the actor is then stepping
its envs) and disarmed when its next step arrives, so the time the learner itself takes
(inference, generation, training that holds inference) never counts. A stream silent past
its timeout is handed to `on_expired`, which cancels it. Reading each message through a
second thread with a timeout would do the same at a thread handoff per message; this keeps
the step path a plain read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable


class IdleStreams:
    def __init__(self, on_expired: Callable[[Hashable, float], None], check_every_s: float = 0.25):
        """`on_expired(key, timeout_s)` is called from the watchdog thread, once per expiry."""
        self._on_expired = on_expired
        self._check_every_s = check_every_s
        self._lock = threading.Lock()
        self._deadlines: dict[Hashable, tuple[float, float]] = {}  # key -> (deadline, its timeout)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="idle-streams", daemon=True)
        self._thread.start()

    def arm(self, key: Hashable, timeout_s: float) -> None:
        with self._lock:
            self._deadlines[key] = (time.monotonic() + timeout_s, timeout_s)

    def disarm(self, key: Hashable) -> None:
        with self._lock:
            self._deadlines.pop(key, None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self._check_every_s):
            now = time.monotonic()
            with self._lock:
                expired = [(key, timeout) for key, (deadline, timeout) in self._deadlines.items() if deadline <= now]
                for key, _ in expired:
                    del self._deadlines[key]
            for key, timeout in expired:
                self._on_expired(key, timeout)
