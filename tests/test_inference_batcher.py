"""Dynamic batching: flush at the size limit, flush on the timeout, and errors reach the callers.

The batcher lives on an event loop (the server's); here a loop runs on a thread of its own,
and the tests submit to it from their thread, in order, as streams on the loop would.
"""

import asyncio
import threading

import pytest

from fleetrl.learner.inference.inference_batcher import BatcherStopped, InferenceBatcher


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


class Batcher(InferenceBatcher):
    """An InferenceBatcher on `loop`, submitted to from this thread: each submit is a future
    of the request's result, for the thread."""

    def __init__(self, loop, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loop = loop
        asyncio.run_coroutine_threadsafe(self._start(), loop).result()

    async def _start(self):
        self.start(asyncio.get_running_loop())

    def submit(self, request):
        async def answer():
            return await super(Batcher, self).submit(request)

        return asyncio.run_coroutine_threadsafe(answer(), self.loop)


class Recorder:
    def __init__(self):
        self.batches = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, requests):
        self.release.wait()
        self.batches.append(list(requests))
        return [r * 10 for r in requests]


def test_requests_arriving_together_share_one_forward_pass(loop):
    handler = Recorder()
    handler.release.clear()  # hold the first batch so that the others queue up behind it
    batcher = Batcher(loop, handler, size_of=lambda r: 4, max_batch_size=8, timeout_s=60.0)
    try:
        futures = [batcher.submit(i) for i in range(6)]
        handler.release.set()
        assert [f.result(timeout=30) for f in futures] == [0, 10, 20, 30, 40, 50]
        # Every batch flushed on size (8 envs = 2 requests), never on the 60 s timeout.
        assert handler.batches == [[0, 1], [2, 3], [4, 5]]
    finally:
        batcher.stop()


def test_a_lone_request_is_served_after_the_timeout(loop):
    handler = Recorder()
    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=1000, timeout_s=0.01)
    try:
        assert batcher.submit(3).result(timeout=30) == 30
        assert handler.batches == [[3]]
    finally:
        batcher.stop()


def test_a_failing_batch_fails_only_the_request_that_fails_alone_and_the_batcher_survives(loop):
    calls = []
    release = threading.Event()

    def handler(requests):
        release.wait()
        calls.append(list(requests))
        if 2 in requests:
            raise ValueError("bad request 2")
        return [r * 10 for r in requests]

    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=3, timeout_s=60.0)
    try:
        futures = [batcher.submit(i) for i in (1, 2, 3)]
        release.set()  # the three are queued: they make one batch of the size limit
        assert futures[0].result(timeout=30) == 10 and futures[2].result(timeout=30) == 30
        with pytest.raises(ValueError, match="bad request 2"):
            futures[1].result(timeout=30)
        assert calls == [[1, 2, 3], [1], [2], [3]] and batcher.isolated_failures == 1
        batcher.timeout_s = 0.0  # a lone request goes at once
        assert batcher.submit(4).result(timeout=30) == 40
    finally:
        batcher.stop()


def test_a_base_exception_reaches_every_request_of_its_batch(loop):
    """Not retried one by one (a KeyboardInterrupt belongs to the batch, not to a request),
    handed to each as a RuntimeError (raised on the loop, it would stop the loop), and the
    batcher goes on."""
    release = threading.Event()
    raised = []

    def handler(requests):
        release.wait()
        if not raised:
            raised.append(True)
            raise KeyboardInterrupt
        return requests

    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=2, timeout_s=60.0)
    try:
        futures = [batcher.submit(i) for i in (1, 2)]
        release.set()
        for future in futures:
            with pytest.raises(RuntimeError, match="ended by KeyboardInterrupt") as info:
                future.result(timeout=30)
            assert isinstance(info.value.__cause__, KeyboardInterrupt)
        batcher.timeout_s = 0.0
        assert batcher.submit(7).result(timeout=30) == 7
    finally:
        batcher.stop()


def test_stopping_fails_waiting_requests(loop):
    handler = Recorder()
    handler.release.clear()
    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=1, timeout_s=0.0)
    blocked = batcher.submit(1)
    waiting = batcher.submit(2)
    threading.Timer(0.2, handler.release.set).start()
    batcher.stop()
    assert blocked.result(timeout=30) == 10
    with pytest.raises(BatcherStopped):
        waiting.result(timeout=30)
    with pytest.raises(BatcherStopped):
        batcher.submit(3).result(timeout=1)


def test_a_cancelled_batch_fails_its_requests_with_batcher_stopped(loop):
    """A batch whose thread future was cancelled (the thread shut down before it ran) hands
    each request BatcherStopped as its error, which streams report as the learner's
    shutdown (handed over as a result, it failed the stream with UNKNOWN: a learner bug to
    the actor)."""
    import concurrent.futures

    batcher = Batcher(loop, Recorder(), size_of=lambda r: 1, max_batch_size=1, timeout_s=60.0)
    cancelled = concurrent.futures.Future()
    cancelled.cancel()

    async def answer_cancelled():
        future = loop.create_future()
        batcher._answer([(1, future, 1)], cancelled)
        return await future

    try:
        with pytest.raises(BatcherStopped):
            asyncio.run_coroutine_threadsafe(answer_cancelled(), loop).result(timeout=30)
    finally:
        batcher.stop()


def test_the_connected_envs_are_read_at_each_batch(loop):
    """A batch that holds every connected env flushes at once, far below its size limit and
    its 60 s timeout; the count changes as actors come and go, and each batch reads it anew."""
    handler = Recorder()
    connected = 1
    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=1000, timeout_s=60.0,
                               connected_envs=lambda: connected)
    try:
        assert batcher.submit(1).result(timeout=30) == 10
        connected = 2  # now a lone request waits for the other env's
        futures = [batcher.submit(2), batcher.submit(3)]
        assert [f.result(timeout=30) for f in futures] == [20, 30]
        assert handler.batches == [[1], [2, 3]]
    finally:
        batcher.stop()


def test_a_batch_waits_for_the_thread_and_takes_what_queued_meanwhile(loop):
    """While one batch is on the inference thread the loop takes more requests; the next
    batch holds all that queued, up to the size limit, and the rest go in the batch after."""
    handler = Recorder()
    handler.release.clear()
    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=3, timeout_s=0.0)
    try:
        futures = [batcher.submit(i) for i in range(6)]
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=30)  # all six submitted
        handler.release.set()
        assert [f.result(timeout=30) for f in futures] == [0, 10, 20, 30, 40, 50]
        assert handler.batches == [[0], [1, 2, 3], [4, 5]]
    finally:
        batcher.stop()


def test_a_batch_with_a_request_from_every_stream_flushes_before_the_timeout(loop):
    """Each stream has at most one step waiting, so once every stream's is in, nothing more
    can come: the batch goes at once, far below its size limit and its 60 s timeout."""
    handler = Recorder()
    streams = 2
    batcher = Batcher(loop, handler, size_of=lambda r: 1, max_batch_size=1000, timeout_s=60.0,
                               max_requests=lambda: streams)
    try:
        futures = [batcher.submit(i) for i in range(2)]
        assert [f.result(timeout=30) for f in futures] == [0, 10]
        streams = 1
        assert batcher.submit(5).result(timeout=30) == 50
        assert handler.batches == [[0, 1], [5]]
    finally:
        batcher.stop()
