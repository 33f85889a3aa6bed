"""The learner's thread pool: a burst gets a thread per task up to the limit, work beyond
it waits its turn, and threads left idle exit."""

import threading
import time

import pytest

from fleetrl.learner.elastic_pool import ElasticThreadPool


def wait_for(condition, timeout_s: float = 10):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_burst_gets_a_thread_per_task_then_the_idle_threads_exit():
    pool = ElasticThreadPool(8, "test", idle_s=0.3)
    release = threading.Event()
    running = []
    futures = [pool.submit(lambda i=i: running.append(i) or release.wait(10) and i) for i in range(8)]
    wait_for(lambda: len(running) == 8)  # all at once: none queued behind another's long task
    assert pool.workers == 8
    release.set()
    assert [f.result(timeout=10) for f in futures] == list(range(8))
    wait_for(lambda: pool.workers == 0)
    assert pool.submit(lambda: 7).result(timeout=10) == 7  # and new work starts a thread again


def test_a_steady_trickle_of_work_keeps_one_thread_and_lets_the_others_exit():
    pool = ElasticThreadPool(8, "test", idle_s=0.3)
    release = threading.Event()
    burst = [pool.submit(release.wait, 10) for _ in range(8)]
    wait_for(lambda: pool.workers == 8)
    release.set()
    for future in burst:
        future.result(timeout=10)
    # Back-to-back short tasks: handed round the 8 threads, each would get one every few
    # milliseconds and none would idle 0.3 s; handed to the last thread that finished, one does
    # them all and the other seven exit.
    def trickle(tasks: int) -> None:
        for _ in range(tasks):
            pool.submit(time.sleep, 0.001).result(timeout=10)

    deadline = time.monotonic() + 10
    while pool.workers > 1:
        assert time.monotonic() < deadline, f"{pool.workers} threads still up under a trickle of work"
        trickle(20)
    trickle(500)  # about twice idle_s of steady work: the one thread stays, no other starts
    assert pool.workers == 1


def test_work_beyond_the_limit_waits_and_runs_in_order():
    pool = ElasticThreadPool(2, "test", idle_s=5)
    release = threading.Event()
    blockers = [pool.submit(release.wait, 10) for _ in range(2)]
    order = []
    waiting = [pool.submit(order.append, i) for i in range(5)]
    time.sleep(0.1)
    assert order == [] and pool.workers == 2
    release.set()
    for future in blockers + waiting:
        future.result(timeout=10)
    assert order == list(range(5))


def test_errors_reach_the_future_and_shutdown_cancels_what_waits():
    pool = ElasticThreadPool(1, "test", idle_s=5)
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=10)
    started, release = threading.Event(), threading.Event()
    blocker = pool.submit(lambda: started.set() or release.wait(10))
    started.wait(10)
    waiting = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    release.set()
    assert blocker.result(timeout=10) is True
