"""The learner's gRPC service: the protocol's states, one stream per actor.

Each actor stream runs in its own gRPC worker thread: it checks the handshake against the
run, allocates the actor's env slots, then for every step decodes and validates the
message (`wire_messages`), submits it to the inference batcher and answers with the actions. A message that
does not match the protocol (see learner.proto), or a step whose inference fails on its
own, ends only that actor's stream, with a status naming the field; every other actor
goes on being served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import NoReturn

import grpc
import numpy as np

from fleetrl.learner.elastic_pool import ElasticThreadPool
from fleetrl.learner.eval_inference import EvalRequest
from fleetrl.learner.idle_streams import IdleStreams
from fleetrl.learner.inference import StepRequest
from fleetrl.learner.inference_batcher import BatcherStopped
from fleetrl.learner.served_run import ServedRun, episode_tag
from fleetrl.learner.wire_messages import Episode, UnreadableMessage, WireDecoder, actor_message_reader
from fleetrl.problems.base import TRAIN
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import WireError, encode_all

log = logging.getLogger(__name__)


class LearnerService(pb_grpc.LearnerServicer):
    def __init__(self, run: ServedRun, max_actors: int):
        self.run = run
        self.decoder = WireDecoder(run)
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
        refusal = self.decoder.check_handshake(handshake)
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
                request, episodes = self.decoder.decode_step(message.step, slots, handshake.num_envs)
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


def learner_handler(service: LearnerService, limit_bytes: int) -> grpc.GenericRpcHandler:
    """The Learner service with a request reader that lets `Stream` reject an oversize or
    unparsable message with INVALID_ARGUMENT (gRPC itself would answer RESOURCE_EXHAUSTED or
    INTERNAL). The transport's own limit must be above `limit_bytes`."""

    def unary(method, request_type, response_type):
        return grpc.unary_unary_rpc_method_handler(method, request_deserializer=request_type.FromString,
                                                   response_serializer=response_type.SerializeToString)

    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            service.Stream, request_deserializer=actor_message_reader(limit_bytes),
            response_serializer=pb.LearnerMessage.SerializeToString),
        "GetRunInfo": unary(service.GetRunInfo, pb.RunInfoRequest, pb.RunInfo),
        "GetStatus": unary(service.GetStatus, pb.StatusRequest, pb.Status),
        "GetEvalWork": unary(service.GetEvalWork, pb.EvalWorkRequest, pb.EvalWork),
    }
    declared = set(pb.DESCRIPTOR.services_by_name["Learner"].methods_by_name)
    if declared != set(handlers):
        raise RuntimeError(f"learner_handler serves {sorted(handlers)} but learner.proto declares {sorted(declared)}")
    return grpc.method_handlers_generic_handler("fleetrl.Learner", handlers)
