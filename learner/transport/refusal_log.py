"""Log lines for refused calls, rate-limited: the first of each kind at once, then at most one
a minute, saying how many more were refused since. A learner started by hand then shows why
an actor cannot join, and a client that retries in a loop cannot flood its log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class RefusalLog:
    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.interval_s, self._clock = interval_s, clock
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def refused(self, kind: str, message: str) -> None:
        """One refusal of `kind` (a status code's name, say), described by `message`."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._since[kind] = self._since.get(kind, 0) + 1
            return
        more = self._since.pop(kind, 0)
        self._last[kind] = now
        log.warning("refused: %s: %s%s", kind, message,
                    f" ({more} more refused {kind} since the last such line)" if more else "")
