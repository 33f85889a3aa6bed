"""Dynamic batching: merges the requests of many actor streams into one forward pass.

Each actor stream thread submits its request and waits on a Future. One batching thread
takes requests off a queue until their envs add up to `max_batch_size` or `timeout_s` has
passed since the first one arrived, then calls `handler` once for all of them. So a slow or
vanished actor delays the others by at most the timeout, and never blocks them.

A batch also flushes as soon as nothing more can join it. `connected_envs`, read at each
batch, is the number of envs that could be waiting: the learner passes its state store's
allocated slots, so a batch that holds every connected env goes at once. `max_requests`,
also read at each batch, is the most requests that can be waiting at once: the learner
passes the number of streams that are stepping (`ConnectedActors.stepping`: connected, and
not gone quiet), since a stream submits its next step only once its last one is answered.
So a batch that holds a step from every stream (an actor whose envs take turns in groups
never has all of them waiting) flushes at once instead of waiting out the timeout.

A batch whose handler raises is retried one request at a time, so that one actor's bad
step fails only that actor's request; the others get their results. The handler must
therefore change nothing when it raises (see `inference.InferenceStep`).

Once `stop()` returns, every submitted request has its answer or BatcherStopped: a request
submitted while the batcher stops is either drained by it or refused at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

Request = TypeVar("Request")


class BatcherStopped(RuntimeError):
    pass


class InferenceBatcher(Generic[Request]):
    def __init__(self, handler: Callable[[Sequence[Request]], Sequence[Any]], size_of: Callable[[Request], int],
                 max_batch_size: int, timeout_s: float, connected_envs: Callable[[], int] | None = None,
                 max_requests: Callable[[], int] | None = None):
        self._handler = handler
        self._size_of = size_of
        self.max_batch_size = max_batch_size
        self._connected_envs = connected_envs
        self._max_requests = max_requests
        self.timeout_s = timeout_s
        self._queue: queue.SimpleQueue[tuple[Request, Future]] = queue.SimpleQueue()
        self._stop = threading.Event()
        # Held while submitting and while stopping, so no request slips in after the drain.
        self._stop_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="inference-batcher", daemon=True)
        self.isolated_failures = 0  # batches that failed and were retried request by request

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._stop_lock:
            self._stop.set()
        self._thread.join(timeout=10)
        while True:  # fail whatever is still waiting, so no stream thread hangs
            try:
                _, future = self._queue.get_nowait()
            except queue.Empty:
                break
            future.set_exception(BatcherStopped("the learner is shutting down"))

    def submit(self, request: Request) -> Future:
        future: Future = Future()
        with self._stop_lock:
            if self._stop.is_set():
                future.set_exception(BatcherStopped("the learner is shutting down"))
            else:
                self._queue.put((request, future))
        return future

    def _next_batch(self) -> list[tuple[Request, Future]]:
        try:
            batch = [self._queue.get(timeout=0.1)]
        except queue.Empty:
            return []
        size = self._size_of(batch[0][0])
        deadline = time.monotonic() + self.timeout_s
        limit = min(self.max_batch_size, self._connected_envs()) if self._connected_envs else self.max_batch_size
        max_requests = self._max_requests() if self._max_requests is not None else float("inf")
        while size < limit and len(batch) < max_requests:
            remaining = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            batch.append(item)
            size += self._size_of(item[0])
        return batch

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._next_batch()
            if batch:
                self._serve(batch)

    def _serve(self, batch: list[tuple[Request, Future]]) -> None:
        try:
            results = self._handler([request for request, _ in batch])
        except Exception as e:
            if len(batch) == 1:
                batch[0][1].set_exception(e)
            else:  # find the request that fails on its own; the others are served
                self.isolated_failures += 1
                for item in batch:
                    self._serve([item])
            return
        except BaseException as e:  # the handler's failure belongs to these requests, not the thread
            for _, future in batch:
                future.set_exception(e)
            return
        for (_, future), result in zip(batch, results):
            future.set_result(result)
