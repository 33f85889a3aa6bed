"""A thread pool whose idle threads exit: the learner's gRPC workers and stream readers.

`concurrent.futures.ThreadPoolExecutor` keeps every thread it ever started, so one burst
of connections (a flood of idle clients, say) would leave the learner holding that many
threads for the rest of the run. Here a worker that finds no work for `idle_s` exits, and
the pool starts threads again as work comes, up to `max_workers`; work beyond that waits
in order, as in ThreadPoolExecutor.

Each submit is handed to a thread when it is made: the idle worker that went idle last,
or a new one, or, at the limit, the first worker to finish. Handing work to the most
recently idle worker (a stack, not a shared queue) keeps a steady load on as few threads
as it needs, so the others really do sit idle and exit.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

_STOP = object()
_Work = tuple[futures.Future, Callable[..., Any], tuple, dict]


class ElasticThreadPool(futures.Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str = "pool", idle_s: float = 5.0):
        if max_workers < 1:
            raise ValueError(f"max_workers is {max_workers}; it must be at least 1")
        self.max_workers, self.idle_s = max_workers, idle_s
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._workers = 0  # threads alive
        self._idle: list[queue.SimpleQueue] = []  # the idle workers' inboxes, the last one to go idle on top
        self._backlog: collections.deque[_Work] = collections.deque()  # work that found every thread busy
        self._started = 0
        self._shutdown = False

    @property
    def workers(self) -> int:
        with self._lock:
            return self._workers

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        work = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                self._idle.pop().put(work)
            elif self._workers < self.max_workers:
                self._workers += 1
                self._started += 1
                threading.Thread(target=self._work, args=(work,), name=f"{self._prefix}_{self._started}",
                                 daemon=True).start()
            else:
                self._backlog.append(work)
        return future

    def _work(self, work: _Work) -> None:
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        while True:
            _run(work)
            del work  # let the work's objects go while this thread idles
            with self._lock:
                if self._backlog:
                    work = self._backlog.popleft()
                    continue
                if self._shutdown:
                    self._workers -= 1
                    return
                self._idle.append(inbox)
            try:
                item = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody handed it work: this thread is not needed
                        self._idle.remove(inbox)
                        self._workers -= 1
                        return
                item = inbox.get()  # a submit took this worker just as it timed out
            if item is _STOP:
                return
            work = item

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops the idle workers; busy ones end when their work does (they are daemon threads)."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for future, *_ in self._backlog:
                    future.cancel()
                self._backlog.clear()
            for inbox in self._idle:
                self._workers -= 1
                inbox.put(_STOP)
            self._idle.clear()


def _run(work: _Work) -> None:
    future, fn, args, kwargs = work
    if future.set_running_or_notify_cancel():
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the future, as ThreadPoolExecutor does
            future.set_exception(e)
        else:
            future.set_result(result)
