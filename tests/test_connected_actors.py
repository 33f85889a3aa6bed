"""The per-stream records on the server's loop: who is stepping, and who went idle too long."""

import asyncio

from fleetrl.learner.transport.connected_actors import ConnectedActors
from fleetrl.proto import learner_pb2 as pb


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_second_stream_with_a_connected_actors_id_is_refused_and_the_first_kept():
    actors = ConnectedActors()
    first = actors.join("a", pb.TRAIN, 30.0)
    assert first is not None and actors.join("a", pb.EVAL, 30.0) is None
    assert actors.mode_of("a") == pb.TRAIN and len(actors) == 1
    actors.leave("a")
    assert actors.mode_of("a") is None and len(actors) == 0


def test_only_streams_that_step_at_their_pace_are_waited_for():
    clock = Clock()
    actors = ConnectedActors(clock)
    fast, quiet = actors.join("fast", pb.TRAIN, 30.0), actors.join("quiet", pb.TRAIN, 30.0)
    actors.join("eval", pb.EVAL, 30.0).stepped(clock())
    assert actors.stepping(pb.TRAIN) == 0  # handshaken, no step yet: nothing to wait for
    for stream in (fast, quiet):
        stream.stepped(clock())
    clock.now += 0.1
    fast.stepped(clock())
    quiet.stepped(clock())
    assert actors.stepping(pb.TRAIN) == 2 and actors.stepping(pb.EVAL) == 1
    clock.now += 1.5  # past twice quiet's 0.1 s interval plus a second
    fast.stepped(clock())
    assert actors.stepping(pb.TRAIN) == 1


def test_a_stream_expires_only_when_silent_past_its_timeout_after_an_answer_and_its_task_is_cancelled():
    async def scenario():
        clock = Clock()
        actors = ConnectedActors(clock)
        task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        stream = actors.join("a", pb.TRAIN, 30.0, task)
        stream.stepped(clock())
        clock.now += 1000  # the learner's own time (inference, a long update) never counts
        assert actors.expire_idle() == []
        stream.answered(clock())
        clock.now += 29
        assert actors.expire_idle() == []
        clock.now += 2
        assert actors.expire_idle() == [stream] and stream.expired
        assert actors.expire_idle() == []  # once
        await asyncio.sleep(0)
        assert task.cancelled()

    asyncio.run(scenario())
