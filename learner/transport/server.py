"""The learner's gRPC service: the protocol's states, one stream per actor.

Every stream runs on the server's event loop (`serving.LearnerServer`), a coroutine each:
it checks the handshake against the run, allocates the actor's env slots, then for every
step decodes and validates the message (`wire_messages`), submits it to the inference
batcher (on the same loop; the forward pass runs on the batcher's thread) and answers with
the actions. A message that does not match the protocol (see learner.proto), or a step
whose inference fails on its own, ends only that actor's stream, with a status naming the
field; every other actor goes on being served.

A refusal is raised as `StreamRejected` and turned into the call's status only by `Stream`,
the outermost frame, once the stream has left `ConnectedActors` and freed its env slots and
its place under --max_actors: a client that sees the status and reconnects at once with
the same id must be admitted, not told its id is still connected.

Nothing here blocks the loop for long: what may wait on a lock the trainer holds or on a
disk (eval work, eval results, the run's status) runs on a worker thread. The counters
and the per-stream records (`ConnectedActors`) are the loop's alone, so they take no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NoReturn

import grpc
import numpy as np

from fleetrl.learner.accounting.metric_rules import MAX_NAME_BYTES
from fleetrl.learner.inference.inference_batcher import BatcherStopped
from fleetrl.learner.transport.connected_actors import ActorStream
from fleetrl.learner.transport.inference_failures import InferenceFailures
from fleetrl.learner.transport.refusal_log import RefusalLog
from fleetrl.learner.transport.served_run import ServedRun
from fleetrl.learner.transport.step_intake import StepIntake
from fleetrl.learner.transport.wire_messages import UnreadableMessage, actor_message_reader
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import WireError, encode_all

log = logging.getLogger(__name__)


class StreamRejected(Exception):
    """Ends a stream with `code` and `message`, once its records are released (see `Stream`)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class LearnerService(pb_grpc.LearnerServicer):
    def __init__(self, run: ServedRun, max_actors: int):
        self.run = run
        self.intake = StepIntake(run)
        self.max_actors = max_actors
        self._open_streams = 0  # handshaken or not; at most max_actors
        self.rejected_messages = 0  # read by other threads: an int
        self.refusals = RefusalLog()
        self._watchdog: asyncio.Task | None = None
        self.failures = InferenceFailures()  # the learner's own, told apart from actors' bad messages

    async def start(self) -> None:
        """On the loop: the batchers and the idle-stream watchdog start serving."""
        loop = asyncio.get_running_loop()
        self.run.train.batcher.start(loop)
        if self.run.evaluation.batcher is not None:
            self.run.evaluation.batcher.start(loop)
        self._watchdog = loop.create_task(self.run.actors.watch_idle())

    def stop_batchers(self) -> None:
        """From the learner's thread: waiting steps get BatcherStopped, so their streams end."""
        self.run.train.batcher.stop()
        if self.run.evaluation.batcher is not None:
            self.run.evaluation.batcher.stop()

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)

    @property
    def connected_actors(self) -> int:
        return len(self.run.actors)

    @property
    def resent_steps(self) -> int:
        return self.run.train.step_ledger.resent

    def count_rejection(self, kind: str = "", message: str = "") -> None:
        """Counts a refused call, and logs it (rate-limited) when it says why."""
        self.rejected_messages += 1
        if message and kind != "CANCELLED":  # an idle stream's end: its watchdog logs it already
            self.refusals.refused(kind, message)

    async def GetRunInfo(self, request: pb.RunInfoRequest, context: grpc.aio.ServicerContext) -> pb.RunInfo:
        contract, rules = self.run.contract, self.run.contract.metric_rules
        return pb.RunInfo(
            protocol_version=PROTOCOL_VERSION, problem=contract.problem, hparams=contract.hparams,
            observation_spec=[s.to_proto() for s in contract.observation_specs],
            action_spec=[s.to_proto() for s in contract.action_specs],
            extra_spec=[s.to_proto() for s in contract.extra_specs],
            num_envs_multiple=self.run.train.unroll_hook.num_envs_multiple,
            max_envs_per_actor=contract.max_envs_per_actor, episode_groups=contract.episode_groups,
            max_message_bytes=contract.max_message_bytes, handshake_timeout_s=self.run.timeouts.handshake_s,
            episode_metrics=rules.episode_names, eval_metrics=rules.eval_names,
            undeclared_metric_slots=rules.undeclared_slots, metric_bound=rules.bound,
            max_metric_name_bytes=MAX_NAME_BYTES)

    async def GetStatus(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.Status:
        return await asyncio.to_thread(self.run.run.status)  # reads counters that ranks exchange under a lock

    async def GetEvalWork(self, request: pb.EvalWorkRequest, context: grpc.aio.ServicerContext) -> pb.EvalWork:
        if self.run.run.is_finished():
            return pb.EvalWork(finished=True)
        mode = self.run.actors.mode_of(request.actor_id)
        if mode != pb.EVAL or self.run.evaluation.rounds is None:
            await self._abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                              f"actor {request.actor_id!r} has no open eval stream: open one with mode EVAL first")
        # A new round copies the model under the policy lock, which a training update may hold.
        work = await asyncio.to_thread(self.run.evaluation.rounds.work, request.actor_id, max(1, request.max_episodes))
        return pb.EvalWork(round=work.round, policy_version=work.policy_version, episodes=work.episodes,
                           retry_after_s=work.retry_after_s)

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        try:
            finished_reason = await self._admitted_stream(context)
        except StreamRejected as rejected:  # every record of the stream is released by now
            await self._abort(context, rejected.code, rejected.message)
        if finished_reason is not None:
            await context.write(pb.LearnerMessage(finished=pb.RunFinished(reason=finished_reason)))

    async def _admitted_stream(self, context: grpc.aio.ServicerContext) -> str | None:
        if self._open_streams >= self.max_actors:
            raise StreamRejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"the learner serves at most {self.max_actors} streams at once (its --max_actors), "
                                 "and that many are open: try again later, or start the learner with a larger "
                                 "--max_actors")
        self._open_streams += 1
        try:
            return await self._stream(context)
        finally:
            self._open_streams -= 1

    async def _stream(self, context: grpc.aio.ServicerContext) -> str | None:
        """Serves one stream; the run's finished reason when it ended the stream, else None."""
        first = await self._first_message(context)
        if first is None:
            return None
        handshake = first.handshake
        refusal = self.intake.decoder.check_handshake(handshake)
        if refusal:
            raise StreamRejected(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        evaluating = handshake.mode == pb.EVAL
        if evaluating and self.run.evaluation.rounds is None:
            raise StreamRejected(grpc.StatusCode.FAILED_PRECONDITION, "this learner runs no evaluation")
        idle_timeout_s = self.run.timeouts.eval_idle_s if evaluating else self.run.timeouts.idle_s
        stream = self.run.actors.join(handshake.actor_id, handshake.mode, idle_timeout_s, asyncio.current_task())
        if stream is None:
            raise StreamRejected(grpc.StatusCode.ALREADY_EXISTS,
                                 f"actor id {handshake.actor_id!r} is already connected; give each actor its own "
                                 "--actor_id")
        store = self.run.evaluation.store if evaluating else self.run.train.store
        if store.free_slots() < handshake.num_envs:  # growing copies every buffer: off the loop
            try:
                await asyncio.to_thread(store.reserve, handshake.num_envs)
            except BaseException:
                self.run.actors.leave(handshake.actor_id)
                raise
        slots = store.allocate(handshake.num_envs)
        if not evaluating:
            self.run.train.unroll_hook.actor_joined(slots)
        try:
            await context.write(pb.LearnerMessage(accepted=pb.HandshakeAccepted(
                run_name=self.run.contract.problem, policy_version=self.run.run.policy_version())))
            log.info("actor %r joined: %s, %d envs (%d actors connected)", handshake.actor_id,
                     pb.ActorMode.Name(handshake.mode).lower(), handshake.num_envs, len(self.run.actors))
            return await self._serve_steps(stream, handshake.num_envs, slots, context)
        finally:
            if not evaluating:
                self.run.train.unroll_hook.actor_left(slots)
                self.intake.release(slots)
            else:
                self.run.evaluation.rounds.disconnect(handshake.actor_id)
            store.release(slots)
            self.run.actors.leave(handshake.actor_id)
            log.info("actor %r left (%d actors connected)", handshake.actor_id, len(self.run.actors))

    async def _serve_steps(self, stream: ActorStream, num_envs: int, slots: np.ndarray,
                           context: grpc.aio.ServicerContext) -> str | None:
        actor, evaluating, clock = stream.actor, stream.mode == pb.EVAL, self.run.actors.clock
        while True:
            stream.answered(clock())  # the actor is stepping its envs: the idle watchdog counts from here
            try:
                message = await context.read()
            except asyncio.CancelledError:  # the client went away, or the watchdog found it silent too long
                if stream.expired:
                    raise StreamRejected(grpc.StatusCode.CANCELLED,
                                         f"actor {actor!r} sent no step for {stream.idle_timeout_s:g} s after its "
                                         "last answer (the learner's --stream_idle_timeout_s)") from None
                raise
            if message is grpc.aio.EOF or self.run.run.is_finished():
                break
            stream.stepped(clock())
            kind = self._kind(message)
            if kind != "step":
                raise StreamRejected(grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor!r}: " + (
                    "handshake repeated: a stream has exactly one handshake, as its first message"
                    if kind == "handshake" else kind))
            try:
                if evaluating:
                    request, episodes = self.intake.decode_eval(message.step, slots, num_envs)
                    # A round's end writes its results: off the loop.
                    take = self.intake.eval_request
                    future = self.run.evaluation.batcher.submit(await asyncio.to_thread(take, actor, request, episodes)
                                                                if episodes else take(actor, request, episodes))
                else:
                    request = self.intake.train_request(message.step, slots, num_envs, actor)
                    future = self.run.train.batcher.submit(request)
            except WireError as e:
                raise StreamRejected(grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor!r}: {e}") from None
            start = time.monotonic()
            try:
                actions = await future
            except BatcherStopped:
                break
            except Exception as e:  # the step passed every check: the failure is the learner's (inference_failures)
                self._inference_failed(actor, e)
            self.failures.served()
            self.run.train.scalars.add("inference/latency_ms", 1000 * (time.monotonic() - start))
            await context.write(pb.LearnerMessage(actions=pb.Actions(actions=encode_all(actions),
                                                                     policy_version=self.run.run.policy_version())))
        if not self.run.run.is_finished():
            return None
        reason = self.run.run.finished_reason()
        if reason.startswith("error:"):  # a failure, not the run's end: a restarted learner resumes it
            raise StreamRejected(grpc.StatusCode.UNAVAILABLE,
                                 f"the learner failed ({reason}); reconnect to its restart")
        return reason

    def _inference_failed(self, actor: str, error: Exception) -> NoReturn:
        """Logs the learner's own failure with its traceback and ends the stream with a status
        the actor retries; stops the run once the failure repeats for every actor."""
        log.error("actor %r: the learner's inference failed on its step; the actor will back off and resend it",
                  actor, exc_info=error)
        if self.failures.failed(actor, self.run.actors.stepping(pb.TRAIN) or len(self.run.actors)):
            self.run.run.finish(f"error: inference failed on every actor's steps, twice each: "
                                f"{type(error).__name__}: {error}")
        raise StreamRejected(grpc.StatusCode.UNAVAILABLE, f"actor {actor!r}: the learner's inference failed on "
                             f"this step ({type(error).__name__}: {error}); back off and resend it") from None

    async def _first_message(self, context: grpc.aio.ServicerContext) -> pb.ActorMessage | None:
        """The handshake, read within the handshake timeout: a connection that never says
        who it is must not hold a stream slot."""
        timeout = self.run.timeouts.handshake_s
        try:
            first = await asyncio.wait_for(context.read(), timeout)
        except asyncio.TimeoutError:
            raise StreamRejected(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"no handshake within {timeout:g} s of opening the stream (the learner's "
                                 "--handshake_timeout_s): send the Handshake as the stream's first message") from None
        if first is grpc.aio.EOF:
            return None
        kind = self._kind(first)
        if kind != "handshake":
            raise StreamRejected(grpc.StatusCode.INVALID_ARGUMENT,
                                 "the first message of a stream must be a handshake, got a step" if kind == "step"
                                 else kind)
        return first

    @staticmethod
    def _kind(message: pb.ActorMessage | UnreadableMessage) -> str:
        """"handshake" or "step", else why the message is refused."""
        if isinstance(message, UnreadableMessage):
            return message.reason
        return message.WhichOneof("kind") or "an empty ActorMessage: set its handshake or its step"

    async def _abort(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
        """Ends the call with `code`, counted as a rejection. gRPC's abort raises; should a
        context ever return from it, this raises all the same, so that no caller goes on."""
        self.count_rejection(code.name, message)
        await context.abort(code, message)
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
