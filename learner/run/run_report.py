"""What a run reports of itself: its status (GetStatus, the launchers' progress line) and
its summary (summary.json, at its end)."""

from __future__ import annotations

import math
from typing import Protocol

from fleetrl.learner.accounting.metrics import RateMeter
from fleetrl.learner.accounting.step_ledger import StepLedger
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.evaluation.eval_rounds import EvalRounds
from fleetrl.learner.inference.inference_step import InferenceStep
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.run.run_files import RunSummary
from fleetrl.learner.run.run_state import RunState
from fleetrl.learner.run.stop_conditions import StopConditions
from fleetrl.learner.training.rank_sync import RankSync
from fleetrl.learner.training.trainer import Trainer
from fleetrl.learner.transport.connected_actors import ConnectedActors
from fleetrl.learner.transport.served_run import ServedRun
from fleetrl.proto import learner_pb2 as pb


class ReportedRun(Protocol):
    """What a report reads of a run (`training_run.TrainingRun` has it all)."""

    config: LearnerConfig
    fleet: RankSync
    env_rate: RateMeter
    eval_rounds: EvalRounds
    trainer: Trainer
    policy: PolicyVersion
    served: ServedRun
    actors: ConnectedActors
    inference: InferenceStep
    step_ledger: StepLedger
    stop_conditions: StopConditions
    run_state: RunState

    def is_finished(self) -> bool: ...

    def finished_reason(self) -> str: ...

    def uptime_s(self) -> float: ...


def run_status(run: ReportedRun) -> pb.Status:
    counts = run.fleet.counts()
    last_eval = run.eval_rounds.last
    eval_metric = run.config.best_metric or "return"
    inference = run.inference
    return pb.Status(
        env_steps=counts.env_steps, env_steps_per_s=run.env_rate.rate(counts.env_steps), episodes=counts.episodes,
        mean_episode_return=run.fleet.shown_return(), policy_lag=run.trainer.last_policy_lag,
        trainer_steps=run.policy.version, connected_actors=len(run.actors),
        finished=run.is_finished(), finished_reason=run.finished_reason(), uptime_s=run.uptime_s(),
        mean_inference_batch_size=inference.batch_envs / max(inference.batches, 1),
        eval_policy_version=last_eval.policy_version if last_eval else 0,
        eval_mean_return=last_eval.metrics.get("return", math.nan) if last_eval else math.nan,
        eval_rounds=run.eval_rounds.completed, return_window=run.config.return_window,
        resent_steps=run.step_ledger.resent, disputed_episodes=run.served.train.accounts.disputed,
        unvouched_episodes=run.served.train.accounts.unvouched, losses=run.trainer.last_losses,
        eval_metric=eval_metric,
        eval_metric_value=last_eval.metrics.get(eval_metric, math.nan) if last_eval else math.nan,
    )


def run_summary(run: ReportedRun) -> RunSummary:
    counts, reason = run.fleet.counts(), run.finished_reason()
    return RunSummary(
        reason=reason, env_steps=counts.env_steps, episodes=counts.episodes,
        mean_episode_return=run.fleet.shown_return(), returns_in_window=run.fleet.shown_return_count(),
        return_window=run.config.return_window,
        trainer_steps=run.policy.version, wall_s=run.uptime_s(), run_wall_s=run.run_state.run_wall_s(),
        target_reached=reason.startswith("target reached") if run.stop_conditions.has_target else None,
    )
