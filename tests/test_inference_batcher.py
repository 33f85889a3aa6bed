"""Dynamic batching: flush at the size limit, flush on the timeout, and errors reach the callers."""

import threading

import pytest

from fleetrl.learner.inference_batcher import BatcherStopped, InferenceBatcher


class Recorder:
    def __init__(self):
        self.batches = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, requests):
        self.release.wait()
        self.batches.append(list(requests))
        return [r * 10 for r in requests]


def test_requests_arriving_together_share_one_forward_pass():
    handler = Recorder()
    handler.release.clear()  # hold the first batch so that the others queue up behind it
    batcher = InferenceBatcher(handler, size_of=lambda r: 4, max_batch_size=8, timeout_s=60.0)
    batcher.start()
    try:
        futures = [batcher.submit(i) for i in range(6)]
        handler.release.set()
        assert [f.result(timeout=30) for f in futures] == [0, 10, 20, 30, 40, 50]
        # Every batch flushed on size (8 envs = 2 requests), never on the 60 s timeout.
        assert handler.batches == [[0, 1], [2, 3], [4, 5]]
    finally:
        batcher.stop()


def test_a_lone_request_is_served_after_the_timeout():
    handler = Recorder()
    batcher = InferenceBatcher(handler, size_of=lambda r: 1, max_batch_size=1000, timeout_s=0.01)
    batcher.start()
    try:
        assert batcher.submit(3).result(timeout=30) == 30
        assert handler.batches == [[3]]
    finally:
        batcher.stop()


def test_handler_errors_reach_every_request_of_the_batch_and_the_batcher_survives():
    calls = []

    def handler(requests):
        calls.append(requests)
        if len(calls) == 1:
            raise ValueError("bad batch")
        return requests

    batcher = InferenceBatcher(handler, size_of=lambda r: 1, max_batch_size=1, timeout_s=0.0)
    batcher.start()
    try:
        with pytest.raises(ValueError, match="bad batch"):
            batcher.submit(1).result(timeout=30)
        assert batcher.submit(2).result(timeout=30) == 2
    finally:
        batcher.stop()


def test_stopping_fails_waiting_requests():
    handler = Recorder()
    handler.release.clear()
    batcher = InferenceBatcher(handler, size_of=lambda r: 1, max_batch_size=1, timeout_s=0.0)
    batcher.start()
    blocked = batcher.submit(1)
    waiting = batcher.submit(2)
    threading.Timer(0.2, handler.release.set).start()
    batcher.stop()
    assert blocked.result(timeout=30) == 10
    with pytest.raises(BatcherStopped):
        waiting.result(timeout=30)
    with pytest.raises(BatcherStopped):
        batcher.submit(3).result(timeout=1)


def test_the_size_limit_is_read_at_each_batch():
    handler = Recorder()
    limit = [1]
    batcher = InferenceBatcher(handler, size_of=lambda r: 1, max_batch_size=lambda: limit[0], timeout_s=60.0)
    batcher.start()
    try:
        # With a limit of 1 a lone request flushes at once, with no 60 s wait.
        assert batcher.submit(1).result(timeout=30) == 10
    finally:
        batcher.stop()


def test_a_batch_with_a_request_from_every_stream_flushes_before_the_timeout():
    """Each stream has at most one step waiting, so once every stream's is in, nothing more
    can come: the batch goes at once, far below its size limit and its 60 s timeout."""
    handler = Recorder()
    streams = 2
    batcher = InferenceBatcher(handler, size_of=lambda r: 1, max_batch_size=1000, timeout_s=60.0,
                               max_requests=lambda: streams)
    batcher.start()
    try:
        futures = [batcher.submit(i) for i in range(2)]
        assert [f.result(timeout=30) for f in futures] == [0, 10]
        streams = 1
        assert batcher.submit(5).result(timeout=30) == 50
        assert handler.batches == [[0, 1], [5]]
    finally:
        batcher.stop()
