"""The learner's gRPC service: handshakes, step validation, and one stream per actor.

Each actor stream runs in its own gRPC worker thread: it checks the handshake against the
Problem, allocates the actor's env slots, then for every step decodes and validates the
message, submits it to the inference batcher and answers with the actions. A message that
does not match the protocol ends only that actor's stream, with a status naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Callable, Iterator, NamedTuple

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from fleetrl import PROTOCOL_VERSION
from fleetrl.learner.env_state_store import EnvStateStore
from fleetrl.learner.eval_inference import EvalRequest
from fleetrl.learner.eval_rounds import EvalRounds
from fleetrl.learner.group_scores import GroupScores
from fleetrl.learner.inference import StepRequest
from fleetrl.learner.inference_batcher import BatcherStopped, InferenceBatcher
from fleetrl.learner.metrics import EpisodeWindow, ScalarMeans
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import Specs, TensorSpec, WireError, decode, decode_all, encode_all, spec_mismatch


@dataclasses.dataclass
class ServedRun:
    """What the service checks actors against, and where it sends their data."""

    problem: str
    hparams: dict[str, str]
    observation_specs: Specs
    action_specs: Specs
    store: EnvStateStore
    batcher: InferenceBatcher
    episodes: EpisodeWindow
    scalars: ScalarMeans
    status: Callable[[], pb.Status]
    finished: threading.Event
    finished_reason: Callable[[], str]
    policy_version: Callable[[], int]
    max_envs_per_actor: int
    group_scores: GroupScores | None = None
    handshake_timeout_s: float = 10.0
    chunk_size: int = 1  # actions per step; > 1: steps carry per-action rewards
    # Eval actors (mode EVAL): their own state store and batcher, and the rounds they play.
    eval_store: EnvStateStore | None = None
    eval_batcher: InferenceBatcher | None = None
    eval_rounds: EvalRounds | None = None

class Episode(NamedTuple):
    """A finished episode as an actor reported it."""

    env: int
    metrics: dict[str, float]
    eval_episode: int | None
    images: dict[str, np.ndarray]  # eval episodes only: Problem.eval_images


# Eval pictures larger than this on a side are refused.
MAX_IMAGE_SIDE = 2048


class LearnerService(pb_grpc.LearnerServicer):
    def __init__(self, run: ServedRun):
        self.run = run
        self._actors_lock = threading.Lock()
        self._actors: dict[str, int] = {}  # actor id -> its mode
        self._rejected_lock = threading.Lock()
        self._rejected = 0

    @property
    def connected_actors(self) -> int:
        with self._actors_lock:
            return len(self._actors)

    def GetRunInfo(self, request: pb.RunInfoRequest, context: grpc.ServicerContext) -> pb.RunInfo:
        return pb.RunInfo(protocol_version=PROTOCOL_VERSION, problem=self.run.problem, hparams=self.run.hparams)

    def GetStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.Status:
        return self.run.status()

    def GetEvalWork(self, request: pb.EvalWorkRequest, context: grpc.ServicerContext) -> pb.EvalWork:
        if self.run.finished.is_set():
            return pb.EvalWork(finished=True)
        with self._actors_lock:
            mode = self._actors.get(request.actor_id)
        if mode != pb.EVAL or self.run.eval_rounds is None:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION,
                         f"actor {request.actor_id!r} has no open eval stream: open one with mode EVAL first")
        work = self.run.eval_rounds.work(request.actor_id, max(1, request.max_episodes))
        return pb.EvalWork(round=work.round, policy_version=work.policy_version, episodes=work.episodes,
                           retry_after_s=work.retry_after_s)

    def Stream(self, request_iterator: Iterator[pb.ActorMessage], context: grpc.ServicerContext):
        # A connection that never says who it is must not hold a worker thread forever.
        deadline = threading.Timer(self.run.handshake_timeout_s, self._drop_silent, args=(context,))
        deadline.start()
        try:
            first = next(request_iterator, None)
        except grpc.RpcError:
            first = None
        finally:
            deadline.cancel()
        if first is None:
            return
        if isinstance(first, UnreadableMessage):
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, first.reason)
        if first.WhichOneof("kind") != "handshake":
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "the first message of a stream must be a handshake, got a step")
        handshake = first.handshake
        problem = self._check_handshake(handshake)
        if problem:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION, problem)
        evaluating = handshake.mode == pb.EVAL
        if evaluating and self.run.eval_rounds is None:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION, "this learner runs no evaluation")
        with self._actors_lock:
            duplicate = handshake.actor_id in self._actors
            if not duplicate:
                self._actors[handshake.actor_id] = handshake.mode
        if duplicate:
            self._reject(context, grpc.StatusCode.ALREADY_EXISTS,
                         f"actor id {handshake.actor_id!r} is already connected; give each actor its own --actor_id")
        store = self.run.eval_store if evaluating else self.run.store
        slots = store.allocate(handshake.num_envs)
        if self.run.group_scores is not None and not evaluating:
            self.run.group_scores.add_actor(slots)
        try:
            yield pb.LearnerMessage(accepted=pb.HandshakeAccepted(
                run_name=self.run.problem, policy_version=self.run.policy_version()))
            for message in request_iterator:
                if self.run.finished.is_set():
                    break
                if isinstance(message, UnreadableMessage):
                    self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, f"actor {handshake.actor_id!r}: {message.reason}")
                if message.WhichOneof("kind") != "step":
                    self._reject(context, grpc.StatusCode.INVALID_ARGUMENT,
                                 "handshake repeated: a stream has exactly one handshake, as its first message")
                try:
                    request, episodes = self._decode_step(message.step, slots, handshake.num_envs)
                    future = (self._submit_eval(handshake.actor_id, request, episodes) if evaluating
                              else self._submit(request, episodes, slots))
                except WireError as e:
                    self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, f"actor {handshake.actor_id!r}: {e}")
                start = time.monotonic()
                try:
                    actions = future.result()
                except BatcherStopped:
                    break
                self.run.scalars.add("inference/latency_ms", 1000 * (time.monotonic() - start))
                yield pb.LearnerMessage(actions=pb.Actions(actions=encode_all(actions),
                                                           policy_version=self.run.policy_version()))
            if self.run.finished.is_set():
                yield pb.LearnerMessage(finished=pb.RunFinished(reason=self.run.finished_reason()))
        finally:
            if self.run.group_scores is not None and not evaluating:
                self.run.group_scores.remove_actor(slots)
            if evaluating:
                self.run.eval_rounds.disconnect(handshake.actor_id)
            store.release(slots)
            with self._actors_lock:
                self._actors.pop(handshake.actor_id, None)

    def _submit(self, request: StepRequest, episodes: list[Episode], slots: np.ndarray):
        self._record_episodes(episodes, slots)
        return self.run.batcher.submit(request)

    def _submit_eval(self, actor_id: str, request: StepRequest, episodes: list[Episode]):
        """Eval episodes go to their round, not to train/; actions come from the round's snapshot."""
        for env, metrics, episode, images in episodes:
            if episode is None:
                raise WireError(f"finished_episodes: env {env} of an eval actor gives no eval_episode")
            try:
                self.run.eval_rounds.record(actor_id, episode, metrics, images)
            except ValueError as e:
                raise WireError(f"finished_episodes: {e}") from None
        snapshot = self.run.eval_rounds.agent_for(actor_id)
        if snapshot is None:
            raise WireError("an eval step before any eval work: call GetEvalWork first")
        return self.run.eval_batcher.submit(EvalRequest(request, snapshot[0]))

    @property
    def rejected_messages(self) -> int:
        with self._rejected_lock:
            return self._rejected

    def count_rejection(self) -> None:
        with self._rejected_lock:
            self._rejected += 1

    def _drop_silent(self, context: grpc.ServicerContext) -> None:
        self.count_rejection()
        context.cancel()

    def _reject(self, context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
        self.count_rejection()
        context.abort(code, message)

    def _check_handshake(self, handshake: pb.Handshake) -> str | None:
        if handshake.protocol_version != PROTOCOL_VERSION:
            return (f"protocol version {handshake.protocol_version} from the actor, but the learner speaks "
                    f"{PROTOCOL_VERSION}: run the same fleetrl version on both")
        if handshake.problem != self.run.problem:
            return f"the actor runs problem {handshake.problem!r} and the learner serves {self.run.problem!r}"
        if not handshake.actor_id:
            return "the handshake has no actor_id"
        if not 0 < handshake.num_envs <= self.run.max_envs_per_actor:
            return (f"the handshake has num_envs = {handshake.num_envs}; this learner takes 1 to "
                    f"{self.run.max_envs_per_actor} envs per actor (--max_envs_per_actor)")
        group_size = self.run.group_scores.group_size if self.run.group_scores is not None else 1
        if handshake.num_envs % group_size and handshake.mode == pb.TRAIN:
            return f"the handshake has num_envs = {handshake.num_envs}, not a multiple of group_size {group_size}"
        try:
            observations = tuple(TensorSpec.from_proto(s) for s in handshake.observation_spec)
            actions = tuple(TensorSpec.from_proto(s) for s in handshake.action_spec)
        except WireError as e:
            return str(e)
        return (spec_mismatch("observation", self.run.observation_specs, observations)
                or spec_mismatch("action", self.run.action_specs, actions))

    def _decode_step(self, step: pb.Step, slots: np.ndarray, num_envs: int) -> tuple[StepRequest, list[Episode]]:
        count = len(step.env_indices)
        if count == 0:
            raise WireError("the step has no env_indices")
        for field in ("run_ids", "rewards", "terminated", "truncated"):
            if len(getattr(step, field)) != count:
                raise WireError(f"{field} has {len(getattr(step, field))} entries for {count} env_indices")
        indices = np.asarray(step.env_indices, np.int64)
        if indices.max() >= num_envs:
            raise WireError(f"env index {int(indices.max())} is unknown: the handshake declared {num_envs} envs")
        if len(np.unique(indices)) != count:
            raise WireError("env_indices repeats an env")
        run_ids = np.asarray(step.run_ids, np.uint64)
        if (run_ids == 0).any():
            raise WireError("run_ids: 0 is reserved, use a random nonzero id per env")
        rewards = np.asarray(step.rewards, np.float32)
        if not np.isfinite(rewards).all():
            bad = int(indices[~np.isfinite(rewards)][0])
            raise WireError(f"rewards: env {bad} has a NaN or infinite reward")
        observation = decode_all(step.observations, self.run.observation_specs, count, "observation")
        action_rewards, actions_executed = self._decode_chunk_results(step, count, indices)
        episodes = []
        for episode in step.finished_episodes:
            if episode.env_index >= num_envs:
                raise WireError(f"finished_episodes: env index {episode.env_index} is unknown")
            if not all(math.isfinite(v) for v in episode.metrics.values()):
                raise WireError(f"finished_episodes: env {episode.env_index} has a NaN or infinite metric")
            episodes.append(Episode(episode.env_index, dict(episode.metrics),
                                    episode.eval_episode if episode.HasField("eval_episode") else None,
                                    _decode_images(episode)))
        request = StepRequest(
            slots=slots[indices], run_ids=run_ids, observation=observation, reward=rewards,
            terminated=np.asarray(step.terminated, bool), truncated=np.asarray(step.truncated, bool),
            action_rewards=action_rewards, actions_executed=actions_executed,
        )
        return request, episodes

    def _decode_chunk_results(self, step: pb.Step, count: int,
                              indices: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        chunk = self.run.chunk_size
        if chunk == 1:
            if step.HasField("action_rewards") or step.actions_executed:
                raise WireError("action_rewards / actions_executed: this Problem has no action chunks (chunk_size 1)")
            return None, None
        if not step.HasField("action_rewards"):
            raise WireError(f"action_rewards missing: this Problem plays chunks of {chunk} actions")
        spec = TensorSpec("action_rewards", np.dtype(np.float32), (chunk,))
        action_rewards = decode(step.action_rewards, spec, count, "action_rewards")
        if not np.isfinite(action_rewards).all():
            bad = int(indices[~np.isfinite(action_rewards).all(axis=1)][0])
            raise WireError(f"action_rewards: env {bad} has a NaN or infinite reward")
        if len(step.actions_executed) != count:
            raise WireError(f"actions_executed has {len(step.actions_executed)} entries for {count} env_indices")
        executed = np.asarray(step.actions_executed, np.int64)
        if (executed > chunk).any():
            raise WireError(f"actions_executed: {int(executed.max())} actions of a chunk of {chunk}")
        return action_rewards, executed

    def _record_episodes(self, episodes: list[Episode], slots: np.ndarray) -> None:
        """Training episodes go to train/ and the recent-return window; teacher-forced ones,
        which executed the oracle's actions, to teacher/ only."""
        if not episodes:
            return
        forced = self.run.store.teacher_forcing(slots[[e.env for e in episodes]])
        for episode, teacher in zip(episodes, forced):
            prefix = "teacher" if teacher else "train"
            for name, value in episode.metrics.items():
                tag = f"episode_{name}" if name in ("return", "length") else name
                self.run.scalars.add(f"{prefix}/{tag}", value)
        self.run.episodes.extend(e.metrics for e, teacher in zip(episodes, forced) if not teacher)


@dataclasses.dataclass
class UnreadableMessage:
    """Handed to `Stream` in place of a message it must reject: too big, or not a message."""

    reason: str


def learner_handler(service: LearnerService, limit_bytes: int) -> grpc.GenericRpcHandler:
    """The Learner service with a request reader that lets `Stream` reject an oversize or
    unparsable message with INVALID_ARGUMENT (gRPC itself would answer RESOURCE_EXHAUSTED or
    INTERNAL). The transport's own limit must be above `limit_bytes`."""

    def read_actor_message(data: bytes) -> pb.ActorMessage | UnreadableMessage:
        if len(data) > limit_bytes:
            return UnreadableMessage(f"a message of {len(data):,} bytes is over the limit of {limit_bytes:,} "
                                     "(--max_message_mb)")
        try:
            return pb.ActorMessage.FromString(data)
        except DecodeError as e:
            return UnreadableMessage(f"the message is not a valid ActorMessage: {e}")

    def unary(method, request_type, response_type):
        return grpc.unary_unary_rpc_method_handler(method, request_deserializer=request_type.FromString,
                                                   response_serializer=response_type.SerializeToString)

    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            service.Stream, request_deserializer=read_actor_message,
            response_serializer=pb.LearnerMessage.SerializeToString),
        "GetRunInfo": unary(service.GetRunInfo, pb.RunInfoRequest, pb.RunInfo),
        "GetStatus": unary(service.GetStatus, pb.StatusRequest, pb.Status),
        "GetEvalWork": unary(service.GetEvalWork, pb.EvalWorkRequest, pb.EvalWork),
    }
    declared = set(pb.DESCRIPTOR.services_by_name["Learner"].methods_by_name)
    if declared != set(handlers):
        raise RuntimeError(f"learner_handler serves {sorted(handlers)} but learner.proto declares {sorted(declared)}")
    return grpc.method_handlers_generic_handler("fleetrl.Learner", handlers)


def _decode_images(episode: pb.EpisodeStats) -> dict[str, np.ndarray]:
    """An eval episode's pictures: [H, W, 3] uint8 each, of a sane size."""
    images = {}
    for message in episode.images:
        image = decode(message, field=f"finished_episodes env {episode.env_index} images")
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or max(image.shape) > MAX_IMAGE_SIDE:
            raise WireError(f"finished_episodes env {episode.env_index} image {message.name!r}: expected [H, W, 3] "
                            f"uint8 of at most {MAX_IMAGE_SIDE} a side, got {image.dtype} {list(image.shape)}")
        images[message.name] = image
    if images and not episode.HasField("eval_episode"):
        raise WireError(f"finished_episodes env {episode.env_index}: images come only with eval episodes")
    return images

