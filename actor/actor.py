"""The actor loop: step N envs, send one Step message, receive actions, repeat.

In eval mode the actor instead asks the learner for episodes of the eval set
(GetEvalWork), plays them (`eval_episodes.EvalEpisodes`) with the learner's
deterministic actions, and asks again.

The actor holds no model and no trajectory: the learner keeps every env's recurrent state
and partial unroll. If the stream breaks because the learner is unreachable, the actor
reconnects with exponential backoff and jitter, resending the step that was not answered,
for up to `max_reconnect_s`. A resent step keeps its sequence number, so the learner counts
its finished episodes once even if it had read it before the break. A rejection (bad
handshake, bad message) is final, except that after a break the learner may still hold
this actor's old stream for a moment (ALREADY_EXISTS), which is waited out like a break.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import queue
import random
import socket
import time
from collections.abc import Iterator

import grpc
import numpy as np

from fleetrl.actor.channel import learner_channel, tls_mistake
from fleetrl.actor.config import ActorConfig
from fleetrl.actor.env_groups import EnvGroup, env_actions, group_bounds, make_env_groups, step_message
from fleetrl.actor.eval_episodes import EvalEpisodes, Pending
from fleetrl.envs.space_check import EnvSpaceError
from fleetrl.envs.vector import make_vector_env
from fleetrl.problems.base import Problem
from fleetrl.problems.eval_records import eval_records
from fleetrl.problems.registry import load_problem, trusted_problem_class
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.auth import read_token
from fleetrl.proto.episode_records import encode_record
from fleetrl.proto.run_ids import new_run_ids
from fleetrl.proto.tensors import decode_all, encode_all

log = logging.getLogger(__name__)

# Codes that mean "the learner is not there right now": worth waiting for. UNKNOWN is not
# among them: it is what gRPC answers when the learner's own code raised, a bug to report
# at once rather than to retry for max_reconnect_s.
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}


class ActorError(RuntimeError):
    """The learner refused this actor, or it could not be reached in time."""


class Actor:
    def __init__(self, config: ActorConfig, problem: Problem | None = None):
        self.config = config
        self.actor_id = config.actor_id or f"{socket.gethostname()}:{os.getpid()}"
        self.learner_address = pick_learner(config.learner_address, self.actor_id)
        try:
            token = read_token(config.auth_token_file)
            self._channel = learner_channel(self.learner_address, config.max_message_mb * 1024 * 1024, token,
                                            config.tls_ca, config.tls_cert, config.tls_key, config.tls_server_name)
        except ValueError as e:
            raise ActorError(str(e)) from None
        self._stub = pb_grpc.LearnerStub(self._channel)
        self._problem = problem
        self.steps_sent = 0  # steps answered by the learner
        self.episodes_sent = 0  # finished episodes in those steps: what the learner counted
        self.episodes_finished = 0  # in steps made, answered or not: their difference is in flight
        self._connected_once = False

    def run(self, max_steps: int | None = None) -> None:
        """Acts until the learner ends the run (or for `max_steps` steps). Raises ActorError on failure."""
        if self._problem is not None:
            problem_name, problem = self.config.problem or self._problem.name, self._problem
        else:
            problem_name, problem = self._problem_from_learner()
        if self.config.mode == "eval":
            episodes = EvalEpisodes(problem, self.config.num_envs)
            try:
                self._evaluate(problem_name, problem, episodes, max_steps)
            except EnvSpaceError as e:
                raise ActorError(str(e)) from None
            finally:
                episodes.close()
                self._channel.close()
            return
        n = self.config.num_envs
        asynchronous = self.config.async_envs or (problem.envs_in_subprocesses and n > 1)
        log.info("stepping %d envs %s in %d group(s)", n, "in subprocesses" if asynchronous else "in this process",
                 self.config.env_groups)

        def vector_env(size: int, first_env: int):
            return make_vector_env(problem.make_actor_env, size, asynchronous, problem.config.group_size,
                                   self.config.seed, first_env=first_env)

        try:
            group_bounds(n, self.config.env_groups, problem.config.group_size)
        except ValueError as e:
            raise ActorError(str(e)) from None
        # Run ids are fresh per process, so a restarted actor never continues an old trajectory.
        try:
            groups = make_env_groups(problem, vector_env, n, self.config.env_groups, new_run_ids(n), self.config.seed)
        except EnvSpaceError as e:  # the first reset's observation: the user's env, in one line
            self._channel.close()
            raise ActorError(str(e)) from None
        try:
            self._act(problem_name, problem, groups, max_steps)
        except EnvSpaceError as e:
            raise ActorError(str(e)) from None
        finally:
            for group in groups:
                group.envs.close()
            self._channel.close()

    def _problem_from_learner(self) -> tuple[str, Problem]:
        info = self._with_retries(lambda: self._stub.GetRunInfo(pb.RunInfoRequest(), wait_for_ready=True, timeout=5))
        if self.config.problem and info.problem != self.config.problem:
            raise ActorError(f"the actor runs problem {self.config.problem!r} and the learner serves {info.problem!r}")
        log.info("learner serves problem %s with hparams %s", info.problem, dict(info.hparams))
        if not self.config.problem:  # the learner's word for it: only a registered name is imported
            try:
                trusted_problem_class(info.problem, f"the learner at {self.learner_address}")
            except ValueError as e:
                self._channel.close()
                raise ActorError(str(e)) from None
        return info.problem, load_problem(info.problem, {**dict(info.hparams), **self.config.hparams})

    def _act(self, problem_name: str, problem: Problem, groups: list[EnvGroup], max_steps: int | None) -> None:
        """Each group's step goes out; each reply (they come in the order sent) steps its
        group, whose next step goes out at once. With one group this is send, wait, step."""
        action_specs = problem.action_specs()
        handshake = handshake_message(problem_name, problem, self.actor_id, self.config.num_envs, pb.TRAIN)

        def play(requests: queue.SimpleQueue, responses) -> bool:
            log.info("connected to %s as %s", self.learner_address, self.actor_id)
            waiting: collections.deque[EnvGroup] = collections.deque()  # groups whose step is unanswered

            def send(group: EnvGroup) -> None:
                if max_steps is None or self.steps_sent + len(waiting) < max_steps:
                    requests.put(pb.ActorMessage(step=group.step))
                    waiting.append(group)

            for group in groups:  # after a reconnect, the steps left unanswered go again
                send(group)
            while waiting:
                reply = next(responses, None)
                if reply is None or reply.WhichOneof("kind") == "finished":
                    reason = reply.finished.reason if reply is not None else "stream closed"
                    log.info("the learner ended the run: %s (%d episodes reached it)", reason, self.episodes_sent)
                    return True
                group = waiting.popleft()
                self.steps_sent += 1
                self.episodes_sent += len(group.step.finished_episodes)
                actions = decode_all(reply.actions.actions, action_specs, group.size, "action")
                group.act(env_actions(actions, action_specs))
                self.episodes_finished += len(group.step.finished_episodes)
                send(group)
            return True

        self._with_retries(lambda: self._stream(handshake, play))

    def _evaluate(self, problem_name: str, problem: Problem, episodes: EvalEpisodes, max_steps: int | None) -> None:
        n, action_specs = self.config.num_envs, problem.action_specs()
        run_ids = new_run_ids(n)
        handshake = handshake_message(problem_name, problem, self.actor_id, self.config.num_envs, pb.EVAL)
        send_records = eval_records(problem).learner_writes_eval_records()

        def play(requests: queue.SimpleQueue, responses) -> bool:
            log.info("connected to %s as eval actor %s", self.learner_address, self.actor_id)
            while max_steps is None or self.steps_sent < max_steps:
                work = self._stub.GetEvalWork(pb.EvalWorkRequest(actor_id=self.actor_id, max_episodes=n), timeout=30)
                if work.finished:
                    return True
                if not work.episodes:
                    time.sleep(work.retry_after_s)
                    continue
                log.info("eval round %d at policy version %d: episodes %s", work.round, work.policy_version,
                         list(work.episodes))
                episodes.start(work.episodes)
                while episodes.playing:
                    pending = episodes.pending()
                    requests.put(pb.ActorMessage(step=eval_step_message(pending, run_ids, send_records)))
                    reply = next(responses, None)
                    if reply is None or reply.WhichOneof("kind") == "finished":
                        return True
                    self.steps_sent += 1
                    episodes.advance(pending, decode_all(reply.actions.actions, action_specs,
                                                         len(pending.env_indices), "action"))
            return True

        def attempt() -> bool:
            episodes.abandon()  # after a reconnect the learner has handed our episodes to others
            return self._stream(handshake, play)

        self._with_retries(attempt)

    def _stream(self, handshake: pb.Handshake, play) -> bool:
        """One stream: sends the handshake, then `play(requests, responses)` until it returns.
        True when the learner ended the run; a broken stream raises grpc.RpcError."""
        requests: queue.SimpleQueue = queue.SimpleQueue()
        requests.put(pb.ActorMessage(handshake=handshake))
        responses = self._stub.Stream(_drain(requests))
        try:
            if next(responses).WhichOneof("kind") == "finished":
                return True
            self._connected_once = True
            return play(requests, responses)
        finally:
            requests.put(None)
            responses.cancel()

    def _with_retries(self, call):
        """Runs `call`, retrying while the learner is unreachable, for up to max_reconnect_s."""
        delay, give_up_at = 0.2, time.monotonic() + self.config.max_reconnect_s
        while True:
            sent_before = self.steps_sent
            try:
                return call()
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                # Our own stream from before a break, which the learner has not yet seen end.
                lingering = code == grpc.StatusCode.ALREADY_EXISTS and self._connected_once
                if code == grpc.StatusCode.UNKNOWN:
                    raise ActorError(f"the learner at {self.learner_address} failed while serving actor "
                                     f"{self.actor_id} (an error in the learner: see its log): {code.name}: "
                                     f"{e.details()}") from None
                if code not in _RETRYABLE and not lingering:
                    raise ActorError(f"the learner at {self.learner_address} refused actor "
                                     f"{self.actor_id}: {code.name}: {e.details()}") from None
                if self.steps_sent > sent_before:  # progress was made: the budget starts again
                    delay, give_up_at = 0.2, time.monotonic() + self.config.max_reconnect_s
                tls = None
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    tls = tls_mistake(self._connection_failure(e), self.learner_address, self.config.tls_ca,
                                      self.config.tls_server_name)
                if tls is not None and (tls[1] or time.monotonic() >= give_up_at):
                    raise ActorError(f"cannot reach the learner at {self.learner_address} over TLS: {tls[0]}") from None
                if time.monotonic() >= give_up_at:
                    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise ActorError(
                            f"no learner answered at {self.learner_address} for "
                            f"{self.config.max_reconnect_s:g}s: is one running there? (check --learner_address "
                            f"against the learner's --bind, and any firewall between them)") from None
                    raise ActorError(f"gave up reaching the learner at {self.learner_address} after "
                                     f"{self.config.max_reconnect_s:g}s: {code.name}: {e.details()}") from None
                wait = min(delay, give_up_at - time.monotonic()) * random.uniform(0.5, 1.0)
                log.warning("learner at %s unavailable (%s); retrying in %.1fs",
                            self.learner_address, code.name, wait)
                time.sleep(max(wait, 0.0))
                delay = min(delay * 2, 10.0)


    def _connection_failure(self, error: grpc.RpcError) -> str:
        """Why the channel does not connect, in gRPC's words: a call that waited for the
        channel only says its deadline passed, so one that does not wait is made to ask."""
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            return error.details() or ""
        try:
            self._stub.GetRunInfo(pb.RunInfoRequest(), timeout=2)
        except grpc.RpcError as probe:
            return probe.details() or ""
        return ""


def pick_learner(addresses: str, actor_id: str) -> str:
    """One address of a comma-separated list of learner ranks', chosen by the actor's id:
    the same rank for the same id, through every reconnect and restart."""
    choices = [a.strip() for a in addresses.split(",") if a.strip()]
    if not choices:
        raise ActorError(f"--learner_address={addresses!r} names no learner")
    return choices[int.from_bytes(hashlib.sha256(actor_id.encode()).digest()[:8], "big") % len(choices)]


def handshake_message(problem_name: str, problem: Problem, actor_id: str, num_envs: int,
                      mode: int = pb.TRAIN) -> pb.Handshake:
    """The first message of a stream: who the actor is, and the specs its steps will follow."""
    return pb.Handshake(
        protocol_version=PROTOCOL_VERSION, problem=problem_name, actor_id=actor_id, num_envs=num_envs, mode=mode,
        observation_spec=[s.to_proto() for s in problem.observation_specs()],
        action_spec=[s.to_proto() for s in problem.action_specs()],
        extra_spec=[s.to_proto() for s in problem.extra_specs()],
    )


def _drain(requests: queue.SimpleQueue) -> Iterator[pb.ActorMessage]:
    while (item := requests.get()) is not None:
        yield item


def eval_step_message(pending: Pending, run_ids: np.ndarray, send_records: bool) -> pb.Step:
    indices = pending.env_indices
    step = step_message(pending.observation, pending.reward, pending.terminated, pending.truncated, run_ids[indices],
                        [], pending.extras, indices.tolist())
    step.finished_episodes.extend(
        pb.EpisodeStats(env_index=e.env_index, metrics=e.metrics, eval_episode=e.episode, images=encode_all(e.images),
                        record=encode_record(e.record) if send_records and e.record is not None else b"")
        for e in pending.finished)
    return step

