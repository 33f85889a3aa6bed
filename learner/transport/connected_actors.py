"""The actors with a handshaken stream open, one `ActorStream` each: the stream's mode, the
pace of its steps, and when it goes idle too long.

Everything here lives on the server's event loop: the service adds a stream at its
handshake, marks its steps and answers, and removes it when it ends; the inference
batchers (on the same loop) ask how many streams of a mode are stepping, so that a batch
holding a step from each of them flushes at once (see `InferenceBatcher`); the idle
watchdog, a task on the loop, ends the streams that went silent. Other threads only read
the count of streams (an int). So no lock: the loop orders every change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ActorStream:
    actor: str
    mode: int  # pb.TRAIN or pb.EVAL
    idle_timeout_s: float
    task: asyncio.Task | None = None  # the stream's handler, cancelled when it goes idle too long
    last_step: float | None = None  # when its last step came
    interval: float = 0.0  # the time between its last two steps
    answered_at: float | None = None  # when it was last answered; None while its step is in the learner's hands
    expired: bool = False  # cancelled for being idle (its handler reports so)

    def stepped(self, now: float) -> None:
        self.interval = now - self.last_step if self.last_step is not None else 0.0
        self.last_step = now
        self.answered_at = None

    def answered(self, now: float) -> None:
        self.answered_at = now


class ConnectedActors:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._streams: dict[str, ActorStream] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def join(self, actor: str, mode: int, idle_timeout_s: float, task: asyncio.Task | None = None
             ) -> ActorStream | None:
        """`actor`'s new stream; None, changing nothing, when an actor of that id is connected already."""
        if actor in self._streams:
            return None
        stream = self._streams[actor] = ActorStream(actor, mode, idle_timeout_s, task)
        return stream

    def leave(self, actor: str) -> None:
        self._streams.pop(actor, None)

    def mode_of(self, actor: str) -> int | None:
        stream = self._streams.get(actor)
        return stream.mode if stream else None

    def stepping(self, mode: int) -> int:
        """Streams in `mode` whose next step a batch may wait for (each has at most one step in
        inference): those that have sent a step and have not gone quiet for over twice their
        last interval between steps plus a second. An actor that handshakes and then sends
        nothing, or stops sending, must not make every batch of the others wait out the timeout."""
        now = self.clock()
        return sum(1 for s in self._streams.values() if s.mode == mode and s.last_step is not None
                   and now - s.last_step <= 2 * s.interval + 1.0)

    def expire_idle(self) -> list[ActorStream]:
        """Cancels the streams silent past their idle timeout since their last answer (the
        learner's own time never counts), and returns them."""
        now = self.clock()
        expired = [s for s in self._streams.values() if s.answered_at is not None and not s.expired
                   and now - s.answered_at > s.idle_timeout_s]
        for stream in expired:
            stream.expired = True
            if stream.task is not None:
                stream.task.cancel()
        return expired

    async def watch_idle(self, check_every_s: float = 0.25) -> None:
        """Runs on the loop until cancelled: the idle watchdog."""
        while True:
            await asyncio.sleep(check_every_s)
            for stream in self.expire_idle():
                log.warning("actor %r sent no step for %g s after its last answer (--stream_idle_timeout_s, plus "
                            "--eval_interval_s for eval actors): its stream is cancelled", stream.actor,
                            stream.idle_timeout_s)
