"""The learner's gRPC service: handshakes, step validation, and one stream per actor.

Each actor stream runs in its own gRPC worker thread: it checks the handshake against the
run, allocates the actor's env slots, then for every step decodes and validates the
message, submits it to the inference batcher and answers with the actions. A message that
does not match the protocol (see learner.proto), or a step whose inference fails on its
own, ends only that actor's stream, with a status naming the field; every other actor
goes on being served.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from typing import Any, NamedTuple, NoReturn, Protocol

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from fleetrl.learner.connected_actors import ConnectedActors
from fleetrl.learner.elastic_pool import ElasticThreadPool
from fleetrl.learner.env_state_store import EnvStateStore
from fleetrl.learner.eval_inference import EvalRequest
from fleetrl.learner.eval_rounds import EvalResult, EvalRounds
from fleetrl.learner.idle_streams import IdleStreams
from fleetrl.learner.inference import StepRequest
from fleetrl.learner.inference_batcher import BatcherStopped, InferenceBatcher
from fleetrl.learner.metrics import EpisodeWindow, ScalarMeans
from fleetrl.learner.step_ledger import StepLedger
from fleetrl.losses.unroll_hook import UnrollHook
from fleetrl.problems.base import TRAIN
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.episode_records import decode_record
from fleetrl.proto.tensors import Specs, TensorSpec, WireError, decode, decode_all, encode_all, spec_mismatch

log = logging.getLogger(__name__)

# Eval pictures larger than this on a side are refused.
MAX_IMAGE_SIDE = 2048


class RunControl(Protocol):
    """What the service asks of the run it serves (the Learner implements it)."""

    def policy_version(self) -> int: ...

    def is_finished(self) -> bool: ...

    def finished_reason(self) -> str: ...

    def status(self) -> pb.Status: ...


@dataclasses.dataclass
class ServedRun:
    """What the service checks actors against, and where it sends their data."""

    problem: str
    hparams: dict[str, str]
    observation_specs: Specs
    action_specs: Specs
    extra_specs: Specs
    episode_groups: tuple[str, ...]
    store: EnvStateStore
    batcher: InferenceBatcher
    unroll_hook: UnrollHook
    episodes: EpisodeWindow
    step_ledger: StepLedger  # train steps already taken in: resent ones count no episodes
    scalars: ScalarMeans
    run: RunControl
    actors: ConnectedActors
    max_envs_per_actor: int
    max_message_bytes: int
    handshake_timeout_s: float = 10.0
    # A stream silent this long after its last answer is cancelled (eval streams wait between rounds).
    idle_timeout_s: float = 300.0
    eval_idle_timeout_s: float = 330.0
    # Eval actors (mode EVAL): their own state store and batcher, and the rounds they play.
    eval_store: EnvStateStore | None = None
    eval_batcher: InferenceBatcher | None = None
    eval_rounds: EvalRounds | None = None
    # Where each complete eval round goes (learner.eval_results.EvalResults).
    eval_results: Callable[[EvalResult], None] | None = None
    # Problem.check_episode_record where the Problem's eval records come to the learner;
    # None: this run takes no records.
    check_episode_record: Callable[[Mapping[str, Any]], None] | None = None


def episode_tag(group: str, metric: str) -> str:
    """TensorBoard's tag for an episode metric: episode/return for the policy's own
    ("train") episodes, episode_teacher/return for another group's. TensorBoard sorts its
    groups by name and opens the first ones, so the episode curves come first."""
    return f"episode/{metric}" if group == TRAIN else f"episode_{group}/{metric}"


class Episode(NamedTuple):
    """A finished episode as an actor reported it."""

    env: int
    metrics: dict[str, float]
    group: str
    eval_episode: int | None
    images: dict[str, np.ndarray]  # eval episodes only: Problem.eval_images
    record: dict[str, Any] | None  # eval episodes only: Problem.episode_record, when the learner writes them


class LearnerService(pb_grpc.LearnerServicer):
    def __init__(self, run: ServedRun, max_actors: int):
        self.run = run
        self.max_actors = max_actors
        self._open_streams = 0  # handshaken or not; at most max_actors
        self._streams_lock = threading.Lock()
        self._rejected_lock = threading.Lock()
        self._rejected = 0
        # Reads each stream's handshake, so that a stream that never sends one is ended on time.
        self._handshake_reader = ElasticThreadPool(max_actors, thread_name_prefix="handshake")
        self._idle_streams = IdleStreams(self._end_idle_stream)

    def close(self) -> None:
        self._handshake_reader.shutdown(wait=False, cancel_futures=True)
        self._idle_streams.close()

    def _end_idle_stream(self, stream: tuple[str, grpc.ServicerContext], timeout_s: float) -> None:
        actor, context = stream
        log.warning("actor %r sent no step for %g s after its last answer (--stream_idle_timeout_s, plus "
                    "--eval_interval_s for eval actors): its stream is cancelled", actor, timeout_s)
        self.count_rejection()
        context.cancel()

    @property
    def connected_actors(self) -> int:
        return len(self.run.actors)

    @property
    def rejected_messages(self) -> int:
        with self._rejected_lock:
            return self._rejected

    @property
    def resent_steps(self) -> int:
        return self.run.step_ledger.resent

    def count_rejection(self) -> None:
        with self._rejected_lock:
            self._rejected += 1

    def GetRunInfo(self, request: pb.RunInfoRequest, context: grpc.ServicerContext) -> pb.RunInfo:
        run = self.run
        return pb.RunInfo(
            protocol_version=PROTOCOL_VERSION, problem=run.problem, hparams=run.hparams,
            observation_spec=[s.to_proto() for s in run.observation_specs],
            action_spec=[s.to_proto() for s in run.action_specs],
            extra_spec=[s.to_proto() for s in run.extra_specs],
            num_envs_multiple=run.unroll_hook.num_envs_multiple, max_envs_per_actor=run.max_envs_per_actor,
            episode_groups=run.episode_groups, max_message_bytes=run.max_message_bytes,
            handshake_timeout_s=run.handshake_timeout_s)

    def GetStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.Status:
        return self.run.run.status()

    def GetEvalWork(self, request: pb.EvalWorkRequest, context: grpc.ServicerContext) -> pb.EvalWork:
        if self.run.run.is_finished():
            return pb.EvalWork(finished=True)
        mode = self.run.actors.mode_of(request.actor_id)
        if mode != pb.EVAL or self.run.eval_rounds is None:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION,
                         f"actor {request.actor_id!r} has no open eval stream: open one with mode EVAL first")
        work = self.run.eval_rounds.work(request.actor_id, max(1, request.max_episodes))
        return pb.EvalWork(round=work.round, policy_version=work.policy_version, episodes=work.episodes,
                           retry_after_s=work.retry_after_s)

    def Stream(self, request_iterator: Iterator[pb.ActorMessage], context: grpc.ServicerContext):
        with self._streams_lock:
            admitted = self._open_streams < self.max_actors
            self._open_streams += admitted
        if not admitted:
            self._reject(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"the learner serves at most {self.max_actors} streams at once (its --max_actors), and that "
                         "many are open: try again later, or start the learner with a larger --max_actors")
        try:
            yield from self._stream(request_iterator, context)
        finally:
            with self._streams_lock:
                self._open_streams -= 1

    def _stream(self, request_iterator: Iterator[pb.ActorMessage], context: grpc.ServicerContext):
        first = self._first_message(request_iterator, context)
        if first is None:
            return
        handshake = first.handshake
        refusal = self._check_handshake(handshake)
        if refusal:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION, refusal)
        evaluating = handshake.mode == pb.EVAL
        if evaluating and self.run.eval_rounds is None:
            self._reject(context, grpc.StatusCode.FAILED_PRECONDITION, "this learner runs no evaluation")
        if not self.run.actors.join(handshake.actor_id, handshake.mode):
            self._reject(context, grpc.StatusCode.ALREADY_EXISTS,
                         f"actor id {handshake.actor_id!r} is already connected; give each actor its own --actor_id")
        store = self.run.eval_store if evaluating else self.run.store
        slots = store.allocate(handshake.num_envs)
        if not evaluating:
            self.run.unroll_hook.actor_joined(slots)
        try:
            yield pb.LearnerMessage(accepted=pb.HandshakeAccepted(
                run_name=self.run.problem, policy_version=self.run.run.policy_version()))
            yield from self._serve_steps(handshake, slots, evaluating, request_iterator, context)
        finally:
            if not evaluating:
                self.run.unroll_hook.actor_left(slots)
            else:
                self.run.eval_rounds.disconnect(handshake.actor_id)
            store.release(slots)
            self._idle_streams.disarm((handshake.actor_id, context))
            self.run.actors.leave(handshake.actor_id)

    def _serve_steps(self, handshake: pb.Handshake, slots: np.ndarray, evaluating: bool,
                     request_iterator: Iterator[pb.ActorMessage], context: grpc.ServicerContext):
        actor = handshake.actor_id
        idle_timeout_s = self.run.eval_idle_timeout_s if evaluating else self.run.idle_timeout_s
        stream = (actor, context)  # disarmed when the stream ends (see Stream)
        while True:
            self._idle_streams.arm(stream, idle_timeout_s)  # the actor is stepping its envs
            try:
                message = next(request_iterator, None)
            except grpc.RpcError:  # cancelled: the client went away, or it was silent too long
                break
            self._idle_streams.disarm(stream)
            if message is None or self.run.run.is_finished():
                break
            self.run.actors.stepped(actor)
            kind = self._kind(message)
            if kind != "step":
                self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor!r}: " + (
                    "handshake repeated: a stream has exactly one handshake, as its first message"
                    if kind == "handshake" else kind))
            try:
                request, episodes = self._decode_step(message.step, slots, handshake.num_envs)
                if evaluating:
                    future = self._submit_eval(actor, request, episodes)
                else:
                    new = self.run.step_ledger.take(int(request.run_ids[0]), message.step.sequence)
                    future = self._submit(request, episodes if new else [])
            except WireError as e:
                self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor!r}: {e}")
            start = time.monotonic()
            try:
                actions = future.result()
            except BatcherStopped:
                break
            except Exception as e:  # its step failed inference on its own (see InferenceBatcher)
                log.error("actor %r: inference failed on its step, ending its stream: %r", actor, e)
                self._reject(context, grpc.StatusCode.INVALID_ARGUMENT,
                             f"actor {actor!r}: the learner's inference failed on this step: {type(e).__name__}: {e}")
            self.run.scalars.add("inference/latency_ms", 1000 * (time.monotonic() - start))
            yield pb.LearnerMessage(actions=pb.Actions(actions=encode_all(actions),
                                                       policy_version=self.run.run.policy_version()))
        if self.run.run.is_finished():
            reason = self.run.run.finished_reason()
            if reason.startswith("error:"):  # a failure, not the run's end: a restarted learner resumes it
                context.abort(grpc.StatusCode.UNAVAILABLE, f"the learner failed ({reason}); reconnect to its restart")
            yield pb.LearnerMessage(finished=pb.RunFinished(reason=reason))

    def _first_message(self, request_iterator: Iterator[pb.ActorMessage],
                       context: grpc.ServicerContext) -> pb.ActorMessage | None:
        """The handshake, read within the handshake timeout: a connection that never says
        who it is must not hold a worker thread."""
        timeout = self.run.handshake_timeout_s
        read = self._handshake_reader.submit(next, request_iterator, None)
        try:
            first = read.result(timeout=timeout)
        except futures.TimeoutError:
            self._reject(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"no handshake within {timeout:g} s of opening the stream (the learner's "
                         "--handshake_timeout_s): send the Handshake as the stream's first message")
        except (grpc.RpcError, futures.CancelledError):  # the client went away
            return None
        if first is None:
            return None
        kind = self._kind(first)
        if kind != "handshake":
            self._reject(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "the first message of a stream must be a handshake, got a step" if kind == "step" else kind)
        return first

    @staticmethod
    def _kind(message: pb.ActorMessage | UnreadableMessage) -> str:
        """"handshake" or "step", else why the message is refused."""
        if isinstance(message, UnreadableMessage):
            return message.reason
        return message.WhichOneof("kind") or "an empty ActorMessage: set its handshake or its step"

    def _submit(self, request: StepRequest, episodes: list[Episode]):
        """Training episodes go to their group's summaries (see `episode_tag`); the "train"
        ones also to the recent-return window. A resent step comes with none (see StepLedger)."""
        for episode in episodes:
            for name, value in episode.metrics.items():
                if name == "return":
                    self.run.scalars.add_with_spread(episode_tag(episode.group, name), value)
                else:
                    self.run.scalars.add(episode_tag(episode.group, name), value)
        self.run.episodes.extend(e.metrics for e in episodes if e.group == TRAIN)
        return self.run.batcher.submit(request)

    def _submit_eval(self, actor_id: str, request: StepRequest, episodes: list[Episode]):
        """Eval episodes go to their round, not to train/; actions come from the round's snapshot."""
        for episode in episodes:
            if episode.eval_episode is None:
                raise WireError(f"finished_episodes: env {episode.env} of an eval actor gives no eval_episode")
            try:
                result = self.run.eval_rounds.record(actor_id, episode.eval_episode, episode.metrics, episode.images,
                                                     episode.record)
            except ValueError as e:
                raise WireError(f"finished_episodes: {e}") from None
            if result is not None and self.run.eval_results is not None:
                self.run.eval_results(result)
        snapshot = self.run.eval_rounds.agent_for(actor_id)
        if snapshot is None:
            raise WireError("an eval step before any eval work: call GetEvalWork first")
        return self.run.eval_batcher.submit(EvalRequest(request, snapshot[0]))

    def _reject(self, context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
        """Ends the call with `code`. gRPC's abort raises; should a context ever return from
        it, this raises all the same, so that no caller goes on past a rejection."""
        self.count_rejection()
        context.abort(code, message)
        raise RuntimeError(f"context.abort({code.name}) returned: {message}")

    def _check_handshake(self, handshake: pb.Handshake) -> str | None:
        run = self.run
        if handshake.protocol_version != PROTOCOL_VERSION:
            return (f"protocol version {handshake.protocol_version} from the actor, but the learner speaks "
                    f"{PROTOCOL_VERSION}: run the same fleetrl version on both")
        if handshake.problem != run.problem:
            return f"the actor runs problem {handshake.problem!r} and the learner serves {run.problem!r}"
        if not handshake.actor_id:
            return "the handshake has no actor_id"
        if not 0 < handshake.num_envs <= run.max_envs_per_actor:
            return (f"the handshake has num_envs = {handshake.num_envs}; this learner takes 1 to "
                    f"{run.max_envs_per_actor} envs per actor (--max_envs_per_actor)")
        if handshake.mode == pb.TRAIN:
            refusal = run.unroll_hook.admit(handshake.num_envs)
            if refusal:
                return refusal
        try:
            observations = tuple(TensorSpec.from_proto(s) for s in handshake.observation_spec)
            actions = tuple(TensorSpec.from_proto(s) for s in handshake.action_spec)
            extras = tuple(TensorSpec.from_proto(s) for s in handshake.extra_spec)
        except WireError as e:
            return str(e)
        return (spec_mismatch("observation", run.observation_specs, observations)
                or spec_mismatch("action", run.action_specs, actions)
                or spec_mismatch("extra", run.extra_specs, extras))

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
        if count > 1 and np.bincount(indices).max() > 1:  # indices are below num_envs here
            raise WireError("env_indices repeats an env")
        run_ids = np.asarray(step.run_ids, np.uint64)
        if (run_ids == 0).any():
            raise WireError("run_ids: 0 is reserved, use a random nonzero id per env")
        rewards = np.asarray(step.rewards, np.float32)
        if not np.isfinite(rewards).all():
            bad = int(indices[~np.isfinite(rewards)][0])
            raise WireError(f"rewards: env {bad} has a NaN or infinite reward")
        request = StepRequest(
            slots=slots[indices], run_ids=run_ids,
            observation=decode_all(step.observations, self.run.observation_specs, count, "observation", indices),
            extras=decode_all(step.extras, self.run.extra_specs, count, "extra", indices),
            reward=rewards, terminated=np.asarray(step.terminated, bool), truncated=np.asarray(step.truncated, bool),
        )
        return request, [self._decode_episode(e, num_envs) for e in step.finished_episodes]

    def _decode_episode(self, episode: pb.EpisodeStats, num_envs: int) -> Episode:
        if episode.env_index >= num_envs:
            raise WireError(f"finished_episodes: env index {episode.env_index} is unknown")
        if not all(math.isfinite(v) for v in episode.metrics.values()):
            raise WireError(f"finished_episodes: env {episode.env_index} has a NaN or infinite metric")
        group = episode.group or TRAIN
        if group not in self.run.episode_groups:
            raise WireError(f"finished_episodes: env {episode.env_index} names episode group {group!r}; "
                            f"this run has {list(self.run.episode_groups)}")
        return Episode(episode.env_index, dict(episode.metrics), group,
                       episode.eval_episode if episode.HasField("eval_episode") else None, _decode_images(episode),
                       self._decode_record(episode))

    def _decode_record(self, episode: pb.EpisodeStats) -> dict[str, Any] | None:
        if not episode.record:
            return None
        field = f"finished_episodes env {episode.env_index} record"
        if not episode.HasField("eval_episode"):
            raise WireError(f"{field}: records come only with eval episodes")
        if self.run.check_episode_record is None:
            raise WireError(f"{field}: this run's Problem takes no episode records on the learner")
        record = decode_record(episode.record, field)
        try:
            self.run.check_episode_record(record)
        except ValueError as e:
            raise WireError(f"{field}: {e}") from None
        return record


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
