"""A client that sends the learner malformed messages at a steady rate, each on a stream of
its own, and tallies how the learner answered them (bench/soak.py runs one).

Each message is one of a few kinds of damage: bytes that do not parse, a step before any
handshake, and after a valid handshake, a step with the wrong observation shape, a step
with a NaN reward or one beyond the problem's bound, garbage, or a step whose episode
reports claim what it did not do: an episode on an env that is not done, a hundred
episodes for two envs, a metric the problem does not declare. The learner should refuse
each with INVALID_ARGUMENT and keep serving everyone else.

A well-formed false report (a done step claiming a return of 500) is not refused but
neutralized: the learner counts its own figures (tests/test_episode_vouching.py). It is
not sent here, as the soak's episode accounting counts only its actors' episodes.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

import grpc
import numpy as np

from fleetrl.actor.actor import handshake_message
from fleetrl.actor.env_groups import step_message
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb

_NUM_ENVS = 2


class HostileClient:
    def __init__(self, address: str, messages_per_s: float, problem: str = "cartpole", seed: int = 0):
        self._address, self._interval = address, 1.0 / messages_per_s
        self._problem_name, self._problem = problem, load_problem(problem)
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-client", daemon=True)
        self._lock = threading.Lock()
        self._tally: collections.Counter[str] = collections.Counter()
        self._sent = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def tally(self) -> dict[str, int]:
        """How the learner answered: "rejected" (INVALID_ARGUMENT), "learner down"
        (UNAVAILABLE), or "<CODE>" for anything else, which would be a fault."""
        with self._lock:
            return dict(self._tally)

    def _run(self) -> None:
        kinds = [self._unparsable, self._step_first, self._wrong_shape, self._nan_reward, self._garbage,
                 self._huge_reward, self._report_without_end, self._many_reports, self._undeclared_metric]
        with grpc.insecure_channel(self._address) as channel:
            call = channel.stream_stream("/fleetrl.Learner/Stream", request_serializer=lambda b: b,
                                         response_deserializer=pb.LearnerMessage.FromString)
            next_at = time.monotonic()
            while not self._stop.is_set():
                messages = kinds[self._sent % len(kinds)]()
                self._sent += 1
                outcome = _send(call, messages)
                with self._lock:
                    self._tally[outcome] += 1
                next_at += self._interval
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _handshake(self) -> bytes:
        actor_id = f"hostile-{self._sent}"
        return pb.ActorMessage(handshake=handshake_message(self._problem_name, self._problem, actor_id,
                                                           _NUM_ENVS)).SerializeToString()

    def _step(self, obs: np.ndarray, reward: np.ndarray, done: bool = False,
              episodes: list[pb.EpisodeStats] = ()) -> bytes:
        run_ids = np.arange(1, _NUM_ENVS + 1, dtype=np.uint64)
        return pb.ActorMessage(step=step_message(obs, reward, np.full(_NUM_ENVS, done), np.zeros(_NUM_ENVS, bool),
                                                 run_ids, list(episodes), {})).SerializeToString()

    def _good_step(self) -> bytes:
        return self._step(self._rng.normal(size=(_NUM_ENVS, 4)).astype(np.float32), np.zeros(_NUM_ENVS, np.float32))

    def _unparsable(self) -> list[bytes]:
        return [b"\xff" * 11 + self._rng.bytes(int(self._rng.integers(0, 50)))]

    def _step_first(self) -> list[bytes]:
        return [self._good_step()]

    def _wrong_shape(self) -> list[bytes]:
        return [self._handshake(), self._step(np.zeros((_NUM_ENVS, 3), np.float32), np.zeros(_NUM_ENVS, np.float32))]

    def _nan_reward(self) -> list[bytes]:
        reward = np.zeros(_NUM_ENVS, np.float32)
        reward[0] = np.nan
        return [self._handshake(), self._step(np.zeros((_NUM_ENVS, 4), np.float32), reward)]

    def _huge_reward(self) -> list[bytes]:
        reward = np.full(_NUM_ENVS, 3e38, np.float32)
        return [self._handshake(), self._step(np.zeros((_NUM_ENVS, 4), np.float32), reward)]

    def _claims(self, done: bool, episodes: list[pb.EpisodeStats]) -> list[bytes]:
        obs, reward = np.zeros((_NUM_ENVS, 4), np.float32), np.ones(_NUM_ENVS, np.float32)
        return [self._handshake(), self._step(obs, reward, done, episodes)]

    def _report_without_end(self) -> list[bytes]:
        return self._claims(False, [pb.EpisodeStats(env_index=0, metrics={"return": 500.0, "length": 500.0})])

    def _many_reports(self) -> list[bytes]:
        return self._claims(True, [pb.EpisodeStats(env_index=0, metrics={"return": 500.0})] * 100)

    def _undeclared_metric(self) -> list[bytes]:
        return self._claims(True, [pb.EpisodeStats(env_index=0, metrics={f"m{i}": 1.0 for i in range(100)})])

    def _garbage(self) -> list[bytes]:
        return [self._handshake(), self._rng.bytes(int(self._rng.integers(1, 200)))]


def _send(call, messages: list[bytes]) -> str:
    """Sends `messages` on a new stream, reading an answer to each; returns how it ended."""
    requests: queue.SimpleQueue = queue.SimpleQueue()
    responses = call(iter(requests.get, None), timeout=10)
    try:
        for message in messages:
            requests.put(message)
            next(responses)
        return "OK"  # every message answered: the learner took in a malformed one
    except grpc.RpcError as e:
        code = e.code()
        return {grpc.StatusCode.INVALID_ARGUMENT: "rejected", grpc.StatusCode.UNAVAILABLE: "learner down"}.get(
            code, code.name)
    finally:
        requests.put(None)
        responses.cancel()
