"""What the learner's gRPC service serves: the run it checks actors against and sends their
data to (`ServedRun`), and what it reads of the run's life (`RunControl`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fleetrl.envs.teacher_forcing import TRAIN
from fleetrl.learner.accounting.episode_accounts import EpisodeAccounts
from fleetrl.learner.accounting.metric_rules import MetricRules
from fleetrl.learner.accounting.metrics import EpisodeWindow, ScalarMeans
from fleetrl.learner.accounting.step_ledger import StepLedger
from fleetrl.learner.evaluation.eval_rounds import EvalResult, EvalRounds
from fleetrl.learner.inference.env_state_store import EnvStateStore
from fleetrl.learner.inference.inference_batcher import InferenceBatcher
from fleetrl.learner.transport.connected_actors import ConnectedActors
from fleetrl.losses.unroll_hook import UnrollHook
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import Specs


class RunControl(Protocol):
    """What the service asks of the run it serves (the Learner implements it)."""

    def policy_version(self) -> int: ...

    def is_finished(self) -> bool: ...

    def finished_reason(self) -> str: ...

    def finish(self, reason: str) -> None: ...

    def status(self) -> pb.Status: ...


@dataclasses.dataclass
class ActorContract:
    """What every actor is checked against: the run's Problem, specs and limits."""

    problem: str
    hparams: dict[str, str]
    observation_specs: Specs
    action_specs: Specs
    extra_specs: Specs
    episode_groups: tuple[str, ...]
    metric_rules: MetricRules  # the episode metrics actors may report
    max_envs_per_actor: int
    max_message_bytes: int


@dataclasses.dataclass
class TrainIntake:
    """Where train actors' steps go, and what the learner counts of them."""

    store: EnvStateStore
    batcher: InferenceBatcher
    unroll_hook: UnrollHook
    episodes: EpisodeWindow
    step_ledger: StepLedger  # train steps already taken in: resent ones count no episodes
    accounts: EpisodeAccounts  # the learner's own return and length of every train env's episode
    scalars: ScalarMeans


@dataclasses.dataclass
class EvalIntake:
    """Eval actors (mode EVAL): their own state store and batcher, the rounds they play, and
    where results go. All None: this run has no eval actors."""

    store: EnvStateStore | None = None
    batcher: InferenceBatcher | None = None
    rounds: EvalRounds | None = None
    # Where each complete eval round goes (learner.run.eval_results.EvalResults).
    results: Callable[[EvalResult], None] | None = None
    # The Problem's check_episode_record where its eval records come to the learner;
    # None: this run takes no records.
    check_episode_record: Callable[[Mapping[str, Any]], None] | None = None


@dataclasses.dataclass
class StreamTimeouts:
    handshake_s: float = 10.0
    # A stream silent this long after its last answer is cancelled (eval streams wait between rounds).
    idle_s: float = 300.0
    eval_idle_s: float = 330.0


@dataclasses.dataclass
class ServedRun:
    """What the service checks actors against, and where it sends their data."""

    contract: ActorContract
    train: TrainIntake
    evaluation: EvalIntake
    run: RunControl
    actors: ConnectedActors
    timeouts: StreamTimeouts = dataclasses.field(default_factory=StreamTimeouts)


def episode_tag(group: str, metric: str) -> str:
    """TensorBoard's tag for an episode metric: episode/return for the policy's own
    ("train") episodes, episode_teacher/return for another group's. TensorBoard sorts its
    groups by name and opens the first ones, so the episode curves come first."""
    return f"episode/{metric}" if group == TRAIN else f"episode_{group}/{metric}"
