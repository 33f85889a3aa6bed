"""Two hundred actor streams at once on localhost: every one is answered, and inference
batches them together (the batch fill issue 35 asks of the transport at fleet scale)."""

import queue

import grpc
import numpy as np
from conftest import cartpole_step, handshake

from fleetrl.proto import learner_pb2_grpc as pb_grpc

STREAMS = 200


def test_two_hundred_streams_are_each_answered_and_batched_together(serve):
    learner = serve(problem="cartpole", train=False, max_actors=STREAMS, inference_batch_size=STREAMS,
                    inference_timeout_ms=200)
    channel = grpc.insecure_channel(learner.address)
    requests = [queue.SimpleQueue() for _ in range(STREAMS)]
    try:
        stub = pb_grpc.LearnerStub(channel)
        responses = [stub.Stream(iter(q.get, None), timeout=120) for q in requests]
        for i, q in enumerate(requests):
            q.put(handshake(actor_id=f"actor-{i}", num_envs=1))
        assert all(next(r).WhichOneof("kind") == "accepted" for r in responses)

        def step_all():
            for i, q in enumerate(requests):
                q.put(cartpole_step(num_envs=1, run_ids=[i + 1], obs=np.full((1, 4), i / STREAMS, np.float32)))
            return [next(r) for r in responses]

        step_all()  # every stream has stepped once: the batcher now waits for all of them
        before = (learner.inference.batch_envs, learner.inference.batches)
        for _ in range(10):
            answers = step_all()
            assert [a.WhichOneof("kind") for a in answers] == ["actions"] * STREAMS
        envs, batches = (now - then for now, then in zip((learner.inference.batch_envs,
                                                          learner.inference.batches), before))
        assert envs == 10 * STREAMS
        assert envs / batches >= 0.8 * STREAMS, f"{batches} batches for {envs} env steps"
    finally:
        for q in requests:
            q.put(None)
        channel.close()
