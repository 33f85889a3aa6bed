"""Dynamic batching: merges the requests of many actor streams into one forward pass.

The batcher lives on the server's event loop, with the streams: a stream awaits the
future `submit` gives it, and the loop goes on reading the other streams. The forward
pass (`handler`) runs on the batcher's own thread, one batch at a time, so the loop never
waits on the model. Each batch costs one handoff to that thread and one back, whatever the
number of requests in it.

While the thread is busy, requests wait on the loop. Once it is free and a request
waits, a batch opens: it goes when its envs add up to `max_batch_size`, or when nothing
more can join it, or `timeout_s` after it opened. So a slow or vanished actor delays the
others by at most the timeout, and never blocks them. "Nothing more can join" is read once
per batch, as it opens: `connected_envs` (the state store's allocated slots: a batch that
holds every connected env goes at once) and `max_requests` (the streams that are stepping,
`ConnectedActors.stepping`; a stream submits its next step only once its last one is
answered, so a batch that holds a step from each goes at once).

A batch whose handler raises is retried one request at a time, on the thread, so that one
actor's bad step fails only that actor's request; the others get their results. The
handler must therefore change nothing when it raises (see `inference.InferenceStep`).

Once `stop()` returns, every submitted request has its answer or BatcherStopped, and
later submits get BatcherStopped.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, Generic, TypeVar

Request = TypeVar("Request")


class BatcherStopped(RuntimeError):
    pass


class InferenceBatcher(Generic[Request]):
    def __init__(self, handler: Callable[[Sequence[Request]], Sequence[Any]], size_of: Callable[[Request], int],
                 max_batch_size: int, timeout_s: float, connected_envs: Callable[[], int] | None = None,
                 max_requests: Callable[[], int] | None = None, name: str = "inference"):
        self._handler = handler
        self._size_of = size_of
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self._connected_envs = connected_envs
        self._max_requests = max_requests
        self._name = name
        self.isolated_failures = 0  # batches that failed and were retried request by request
        # Only the loop touches these.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: futures.ThreadPoolExecutor | None = None
        self._waiting: collections.deque[tuple[Request, asyncio.Future, int]] = collections.deque()
        self._waiting_envs = 0  # their sizes' sum: a submit checks the open batch without walking the queue
        self._in_flight: futures.Future | None = None  # the batch on the thread
        self._opened: tuple[float, int, float] | None = None  # the open batch: (deadline, env limit, request limit)
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serves the requests submitted on `loop`, which must be running."""
        self._loop = loop
        self._thread = futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)

    def submit(self, request: Request) -> asyncio.Future:
        """On the loop: a future for `request`'s result."""
        future = self._loop.create_future()
        if self._stopped:
            future.set_exception(BatcherStopped("the learner is shutting down"))
            return future
        size = self._size_of(request)
        self._waiting.append((request, future, size))
        self._waiting_envs += size
        self._dispatch()
        return future

    def stop(self) -> None:
        """From any thread but the loop's: fails the waiting requests, lets the batch in
        flight finish (10 s at most), and stops the thread."""
        if self._loop is None:
            self._stopped = True
            return
        if self._loop.is_running():
            in_flight = asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result()
            if in_flight is not None:
                futures.wait([in_flight], timeout=10)
                # Its answers are handed out by a loop callback queued before this one.
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result()
        self._stopped = True
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _stop(self) -> futures.Future | None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        while self._waiting:
            _, future, _ = self._waiting.popleft()
            if not future.done():
                future.set_exception(BatcherStopped("the learner is shutting down"))
        self._waiting_envs = 0
        return self._in_flight

    # ----- on the loop -----

    def _dispatch(self) -> None:
        """Sends the open batch to the thread if it is full, else makes sure its deadline will."""
        if self._in_flight is not None or not self._waiting or self._stopped:
            return
        if self._opened is None:  # open a batch: what can still join it is read now
            limit = min(self.max_batch_size, self._connected_envs()) if self._connected_envs else self.max_batch_size
            max_requests = self._max_requests() if self._max_requests is not None else float("inf")
            self._opened = (time.monotonic() + self.timeout_s, limit, max_requests)
        deadline, limit, max_requests = self._opened
        if self._waiting_envs >= limit or len(self._waiting) >= max_requests or time.monotonic() >= deadline:
            self._send(limit, max_requests)
        elif self._timer is None:
            self._timer = self._loop.call_at(self._loop.time() + deadline - time.monotonic(), self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        self._dispatch()

    def _send(self, limit: int, max_requests: float) -> None:
        """Sends the waiting requests to the thread, in order, until the batch is full."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._opened = None
        batch, size = [], 0
        while self._waiting and (not batch or (size < limit and len(batch) < max_requests)):
            batch.append(self._waiting.popleft())
            size += batch[-1][2]
        self._waiting_envs -= size
        self._in_flight = self._thread.submit(self._serve, [request for request, _, _ in batch])
        # One wake-up of the loop per batch: its results are handed out there.
        self._in_flight.add_done_callback(lambda done: self._loop.call_soon_threadsafe(self._answer, batch, done))

    def _answer(self, batch: list[tuple[Request, asyncio.Future, int]], done: futures.Future) -> None:
        self._in_flight = None
        try:
            outcomes = done.result()
        except futures.CancelledError:
            outcomes = [_Failed(BatcherStopped("the learner is shutting down"))] * len(batch)
        for (_, future, _), outcome in zip(batch, outcomes):
            if future.done():  # its stream went away
                continue
            if isinstance(outcome, _Failed):
                future.set_exception(outcome.error)
            else:
                future.set_result(outcome)
        self._dispatch()

    # ----- on the batcher's thread -----

    def _serve(self, requests: list[Request]) -> list[Any]:
        """Each request's result, or `_Failed` with what it raised."""
        try:
            return list(self._handler(requests))
        except Exception as e:
            if len(requests) == 1:
                return [_Failed(e)]
            self.isolated_failures += 1  # find the request that fails on its own; the others are served
            return [self._serve([request])[0] for request in requests]
        except BaseException as e:  # noqa: BLE001 - the batch's, not a request's; and not the loop's to raise
            error = RuntimeError(f"the inference step ended by {e!r}")
            error.__cause__ = e
            return [_Failed(error)] * len(requests)


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error

