"""Decoding and validation of what actors send: handshakes, steps, finished episodes, eval
records and pictures, and the raw bytes of each stream message.

Every check raises WireError (or returns the refusal, for a handshake) with a message that
names the field and the env, which the service sends back with INVALID_ARGUMENT or
FAILED_PRECONDITION. Nothing here is pickled or evaluated: tensors are raw bytes checked
against the handshake's specs (`fleetrl.proto.tensors`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from fleetrl.envs.teacher_forcing import TRAIN
from fleetrl.learner.inference.inference_step import StepRequest
from fleetrl.learner.transport.served_run import ServedRun
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.episode_records import decode_record
from fleetrl.proto.tensors import TensorSpec, WireError, decode, decode_all, spec_mismatch

# Eval pictures larger than this on a side are refused.
MAX_IMAGE_SIDE = 2048


class Episode(NamedTuple):
    """A finished episode as an actor reported it."""

    env: int
    row: int  # the env's row in its step
    metrics: dict[str, float]
    group: str
    eval_episode: int | None
    images: dict[str, np.ndarray]  # eval episodes only: Problem.eval_images
    record: dict[str, Any] | None  # eval episodes only: Problem.episode_record, when the learner writes them


class WireDecoder:
    """The run's checks of each actor message."""

    def __init__(self, run: ServedRun):
        self.run = run

    def check_handshake(self, handshake: pb.Handshake) -> str | None:
        """Why the handshake does not fit the run, or None when it does."""
        run = self.run
        if handshake.protocol_version != PROTOCOL_VERSION:
            return (f"protocol version {handshake.protocol_version} from the actor, but the learner speaks "
                    f"{PROTOCOL_VERSION}: run the same fleetrl version on both")
        if handshake.problem != run.contract.problem:
            return f"the actor runs problem {handshake.problem!r} and the learner serves {run.contract.problem!r}"
        if not handshake.actor_id:
            return "the handshake has no actor_id"
        if not 0 < handshake.num_envs <= run.contract.max_envs_per_actor:
            return (f"the handshake has num_envs = {handshake.num_envs}; this learner takes 1 to "
                    f"{run.contract.max_envs_per_actor} envs per actor (--max_envs_per_actor)")
        if handshake.mode == pb.TRAIN:
            refusal = run.train.unroll_hook.admit(handshake.num_envs)
            if refusal:
                return refusal
        try:
            observations = tuple(TensorSpec.from_proto(s) for s in handshake.observation_spec)
            actions = tuple(TensorSpec.from_proto(s) for s in handshake.action_spec)
            extras = tuple(TensorSpec.from_proto(s) for s in handshake.extra_spec)
        except WireError as e:
            return str(e)
        return (spec_mismatch("observation", run.contract.observation_specs, observations)
                or spec_mismatch("action", run.contract.action_specs, actions)
                or spec_mismatch("extra", run.contract.extra_specs, extras))

    def decode_step(self, step: pb.Step, slots: np.ndarray, num_envs: int,
                    evaluating: bool = False) -> tuple[StepRequest, list[Episode]]:
        """A step's request for the inference batcher (env slots from `slots`), and the
        episodes it ended; raises WireError naming the field that is wrong."""
        count = len(step.env_indices)
        if count == 0:
            raise WireError("the step has no env_indices")
        for field in ("run_ids", "rewards", "terminated", "truncated"):
            if len(getattr(step, field)) != count:
                raise WireError(f"{field} has {len(getattr(step, field))} entries for {count} env_indices")
        indices = np.array(step.env_indices[:], np.int64)  # a slice is a list: 3x faster than the container
        if indices.max() >= num_envs:
            raise WireError(f"env index {int(indices.max())} is unknown: the handshake declared {num_envs} envs")
        if count > 1 and np.bincount(indices).max() > 1:  # indices are below num_envs here
            raise WireError("env_indices repeats an env")
        run_ids = np.array(step.run_ids[:], np.uint64)
        if (run_ids == 0).any():
            raise WireError("run_ids: 0 is reserved, use a random nonzero id per env")
        rewards = np.array(step.rewards[:], np.float32)
        bound = self.run.contract.metric_rules.bound
        if not (np.abs(rewards) <= bound).all():  # one test for NaN, inf and too large
            row = int(np.flatnonzero(~(np.abs(rewards) <= bound))[0])
            if not np.isfinite(rewards[row]):
                raise WireError(f"rewards: env {int(indices[row])} has a NaN or infinite reward")
            raise WireError(f"rewards: env {int(indices[row])} has a reward of {float(rewards[row]):g}, beyond the "
                            f"problem's bound of {bound:g} (Problem.metric_bound)")
        request = StepRequest(
            slots=slots[indices], run_ids=run_ids,
            observation=decode_all(step.observations, self.run.contract.observation_specs, count, "observation",
                                   indices),
            extras=decode_all(step.extras, self.run.contract.extra_specs, count, "extra", indices),
            reward=rewards, terminated=np.array(step.terminated[:], bool), truncated=np.array(step.truncated[:], bool),
        )
        if not step.finished_episodes:
            return request, []
        return request, self._finished(step.finished_episodes, indices, request, num_envs, evaluating)

    def _finished(self, reports, indices: np.ndarray, request: StepRequest, num_envs: int,
                  evaluating: bool) -> list[Episode]:
        """The step's finished episodes: at most one per env, each on an env that is done."""
        if len(reports) > len(indices):
            raise WireError(f"finished_episodes has {len(reports)} episodes for a step of {len(indices)} envs: at "
                            "most one per env")
        listed = indices.tolist()  # a few reports a step: list.index beats building a dict
        done = request.terminated | request.truncated
        episodes, rows = [], set()
        for report in reports:
            try:
                row = listed.index(report.env_index)
            except ValueError:
                raise WireError(f"finished_episodes: env {report.env_index} is not in this step's env_indices") \
                    from None
            if row in rows:
                raise WireError(f"finished_episodes: env {report.env_index} has more than one episode in this step")
            if not done[row]:
                raise WireError(f"finished_episodes: env {report.env_index} is neither terminated nor truncated in "
                                "this step, so no episode of it ended here")
            rows.add(row)
            episodes.append(self.decode_episode(report, num_envs, row, evaluating))
        return episodes

    def decode_episode(self, episode: pb.EpisodeStats, num_envs: int, row: int = 0,
                       evaluating: bool = False) -> Episode:
        """A finished episode of a step (on the step's row `row`); raises WireError naming what is wrong."""
        if episode.env_index >= num_envs:
            raise WireError(f"finished_episodes: env index {episode.env_index} is unknown")
        self.run.contract.metric_rules.check(episode.env_index, episode.metrics, evaluating)
        group = episode.group or TRAIN
        if group not in self.run.contract.episode_groups:
            raise WireError(f"finished_episodes: env {episode.env_index} names episode group {group!r}; "
                            f"this run has {list(self.run.contract.episode_groups)}")
        return Episode(episode.env_index, row, dict(episode.metrics), group,
                       episode.eval_episode if episode.HasField("eval_episode") else None, decode_images(episode),
                       self._record(episode))

    def _record(self, episode: pb.EpisodeStats) -> dict[str, Any] | None:
        if not episode.record:
            return None
        field = f"finished_episodes env {episode.env_index} record"
        if not episode.HasField("eval_episode"):
            raise WireError(f"{field}: records come only with eval episodes")
        if self.run.evaluation.check_episode_record is None:
            raise WireError(f"{field}: this run's Problem takes no episode records on the learner")
        record = decode_record(episode.record, field)
        try:
            self.run.evaluation.check_episode_record(record)
        except ValueError as e:
            raise WireError(f"{field}: {e}") from None
        return record


def decode_images(episode: pb.EpisodeStats) -> dict[str, np.ndarray]:
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


@dataclasses.dataclass
class UnreadableMessage:
    """Handed to `Stream` in place of a message it must reject: too big, or not a message."""

    reason: str


def actor_message_reader(limit_bytes: int) -> Callable[[bytes], pb.ActorMessage | UnreadableMessage]:
    """gRPC's request deserializer for the actor stream: an oversize or unparsable message
    becomes an UnreadableMessage, which the stream rejects with INVALID_ARGUMENT (gRPC itself
    would answer RESOURCE_EXHAUSTED or INTERNAL)."""

    def read_actor_message(data: bytes) -> pb.ActorMessage | UnreadableMessage:
        if len(data) > limit_bytes:
            return UnreadableMessage(f"a message of {len(data):,} bytes is over the limit of {limit_bytes:,} "
                                     "(--max_message_mb)")
        try:
            return pb.ActorMessage.FromString(data)
        except DecodeError as e:
            return UnreadableMessage(f"the message is not a valid ActorMessage: {e}")

    return read_actor_message
