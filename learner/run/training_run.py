"""A run's every part but its transport: the learner's data path, drivable from one thread.

A `TrainingRun` holds the model, the inference step and its env state store (which
assembles unrolls), the algorithm's unroll hook, the unroll queue, the trainer, eval
rounds, checkpoints and the run's files. Who feeds it actor steps and calls
`train_step` is the driver's business: the served learner (`learner.Learner`) does it
from gRPC streams and threads, the debug run (`fleetrl.launch.debug_run`) from one
thread, with breakpoints anywhere. Both go through the same objects, so there is one
implementation of inference and of unroll assembly.

A run started on a logdir that holds checkpoints resumes from the latest: weights,
optimizer, counters and RNG states.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

import torch

from fleetrl.envs.teacher_forcing import episode_groups
from fleetrl.learner.accounting.episode_accounts import EpisodeAccounts
from fleetrl.learner.accounting.metric_rules import MetricRules
from fleetrl.learner.accounting.metrics import EpisodeWindow, RateMeter, ScalarMeans
from fleetrl.learner.accounting.step_ledger import StepLedger
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.evaluation.eval_inference import EvalInference
from fleetrl.learner.evaluation.eval_rounds import EvalRounds, frozen_copy
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_batcher import InferenceBatcher
from fleetrl.learner.inference.inference_step import InferenceStep
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.run.eval_results import EvalResults
from fleetrl.learner.run.run_files import RunSummary, rank_logdir, write_run_config
from fleetrl.learner.run.run_report import run_status, run_summary
from fleetrl.learner.run.run_state import RunState
from fleetrl.learner.run.stop_conditions import StopConditions
from fleetrl.learner.run.summaries import TrainSummaries
from fleetrl.learner.training.data_parallel import DataParallel
from fleetrl.learner.training.rank_sync import RankSync
from fleetrl.learner.training.sharded import ShardedAgent
from fleetrl.learner.training.trainer import Trainer
from fleetrl.learner.training.unroll_queue import UnrollQueue
from fleetrl.learner.training.unroll_recorder import recorder_for
from fleetrl.learner.transport.connected_actors import ConnectedActors
from fleetrl.learner.transport.served_run import ActorContract, EvalIntake, ServedRun, StreamTimeouts, TrainIntake
from fleetrl.losses.batch import Unroll, UnrollBatch
from fleetrl.losses.lr_schedule import LearningRateSchedule
from fleetrl.problems.base import Problem
from fleetrl.problems.eval_records import eval_records
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb

log = logging.getLogger(__name__)


class TrainingRun:
    # Each part is built after the parts it is handed, and no part is handed a callable that
    # reads an attribute set later: a line moved above what it needs fails here, not mid-run.
    def __init__(self, config: LearnerConfig, problem: Problem | None = None, unroll_queue_size: int | None = None):
        """`unroll_queue_size` overrides the config's (0: unbounded, for a driver that
        trains on one thread and so must never block inference on a full queue)."""
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.device = torch.device(config.device)
        self.ranks = DataParallel.of(config, self.device)  # None for one learner; docs/deployment.md
        self.own_logdir = rank_logdir(config.logdir, config.rank)  # rank 0: the logdir; rank r: its rank<r>/
        self.problem = problem or load_problem(config.problem, config.hparams)
        self.agent = self.problem.make_agent().to(self.device)  # inference's (and, without FSDP, training's)
        self.sharded = ShardedAgent.of(config, self.agent, self.ranks)  # None without --fsdp
        self.optimizer = self.problem.make_optimizer((self.sharded.training if self.sharded else self.agent)
                                                     .parameters())
        self.lr_schedule = LearningRateSchedule(self.problem.config.learning_rate_schedule, config.total_env_steps,
                                                self.problem.config.learning_rate_warmup_updates)
        if self.problem.config.learning_rate_schedule != "constant" and not self.lr_schedule.decays:
            log.warning("learning_rate_schedule=%s decays over --total_env_steps, and this run has none: the "
                        "learning rate stays at %g", self.problem.config.learning_rate_schedule,
                        self.problem.config.learning_rate)
        self.policy = PolicyVersion()
        self.stop = threading.Event()
        self._reason = ""
        self._started = time.monotonic()
        self.episodes = EpisodeWindow(config.return_window)
        self.scalars = ScalarMeans()
        self.env_rate = RateMeter()
        self.actors = ConnectedActors()

        # Training: inference -> state store -> unroll hook -> unroll queue -> trainer.
        self.recorder = recorder_for(self.own_logdir, config.record_unrolls,
                                     self.problem.action_space() if config.record_unrolls else None)
        self.trainer = Trainer(self.problem, self.agent, self.optimizer, self.policy, self.device,
                               config.block_inference_on_training, config.seed, self.ranks, self.sharded,
                               self.recorder)
        if config.batch_size % self.trainer.minibatches:  # found now, not at the first update
            raise ValueError(f"batch_size {config.batch_size} does not split into the Problem's "
                             f"{self.trainer.minibatches} minibatches; change --batch_size or minibatches")
        self.unroll_hook = self.trainer.algorithm.unroll_hook(self.problem.config)
        self.unrolls = UnrollQueue(config.unroll_queue_size if unroll_queue_size is None else unroll_queue_size,
                                   self.stop)
        self.store = build_state_store(self.problem, self.agent, config.unroll_length, self.device)
        self.inference = InferenceStep(self.problem, self.agent, self.policy, self.store, self._emit_unroll,
                                       self.device, config.inference_transfer)
        self.batcher = InferenceBatcher(self.inference, len, config.inference_batch_size,
                                        config.inference_timeout_ms / 1000, self.store.num_allocated,
                                        functools.partial(self.actors.stepping, pb.TRAIN), name="inference")

        # Evaluation: eval actors play rounds with frozen snapshots, through their own batcher.
        self.eval_store = build_state_store(self.problem, self.agent, 0, self.device, record=False)
        self.eval_inference = EvalInference(self.problem, self.eval_store, self.device, config.inference_transfer)
        self.eval_batcher = InferenceBatcher(self.eval_inference, len, config.inference_batch_size,
                                             config.inference_timeout_ms / 1000, self.eval_store.num_allocated,
                                             functools.partial(self.actors.stepping, pb.EVAL), name="eval-inference")
        self.eval_rounds = EvalRounds(self._eval_snapshot, self.problem.num_eval_episodes(), config.eval_interval_s)

        self.step_ledger = StepLedger()
        self.fleet = RankSync(config.world_size, lambda: self.inference.env_steps, self.episodes,
                              config.return_window, [p for p in self.agent.parameters() if p.requires_grad],
                              config.collective_timeout_s)
        self.run_state = RunState(config, self.agent, self.optimizer, self.policy, self.inference, self.episodes,
                                  self.step_ledger, self.eval_rounds, self.trainer.shuffle_generator, self.device,
                                  self.fleet, self.sharded)
        records = eval_records(self.problem)
        takes_records = records.learner_writes_eval_records()  # eval actors send episode records
        self.eval_results = EvalResults(self.own_logdir, config.best_metric, self.run_state,
                                        records.write_eval_records if takes_records else None)
        self.resumed_from = self.run_state.resume_or_warm_start()
        if self.ranks:  # every rank starts from rank 0's weights (a resume loaded the same ones everywhere)
            self.ranks.broadcast_module(self.agent)
        if self.sharded:
            self.sharded.load_inference_weights()
        self.stop_conditions = StopConditions(config, self.fleet, self.run_state)

        # What actors' steps are checked against and taken into, whoever delivers them.
        self.served = ServedRun(
            contract=ActorContract(
                problem=config.problem, hparams=dict(config.hparams),
                observation_specs=self.problem.observation_specs(), action_specs=self.problem.action_specs(),
                extra_specs=self.problem.extra_specs(),
                episode_groups=episode_groups(self.problem.config.teacher_forcing_fraction),
                metric_rules=MetricRules.of(self.problem, config.problem),
                max_envs_per_actor=config.max_envs_per_actor, max_message_bytes=config.max_message_mb * 1024 * 1024),
            train=TrainIntake(store=self.store, batcher=self.batcher, unroll_hook=self.unroll_hook,
                              episodes=self.episodes, step_ledger=self.step_ledger, accounts=EpisodeAccounts(),
                              scalars=self.scalars),
            evaluation=EvalIntake(store=self.eval_store, batcher=self.eval_batcher, rounds=self.eval_rounds,
                                  results=self.eval_results,
                                  check_episode_record=records.check_episode_record if takes_records else None),
            run=self, actors=self.actors,
            timeouts=StreamTimeouts(handshake_s=config.handshake_timeout_s, idle_s=config.stream_idle_timeout_s,
                                    eval_idle_s=config.stream_idle_timeout_s + (config.eval_interval_s or 0)),
        )

    # ----- the run's files -----

    def open(self) -> TrainSummaries:
        """The run's config.json, its TensorBoard writer and its eval files."""
        os.makedirs(self.own_logdir, exist_ok=True)
        run_config = write_run_config(self.config, self.problem, self.own_logdir)
        summaries = TrainSummaries(self.own_logdir, self.scalars, self.inference, self.policy, self.gauges,
                                   resumed=self.resumed_from is not None, config=run_config,
                                   env_steps=lambda: self.fleet.counts().env_steps)
        self.eval_results.open(resumed=self.resumed_from is not None)
        return summaries

    def close(self, summaries: TrainSummaries, stopped_together: bool, failed: bool) -> str | None:
        """The last summaries, the final checkpoint (its path; None when not written) and
        the run's files. `stopped_together`: every learner rank left at the same batch."""
        summaries.write()
        if self.recorder is not None:  # a run shorter than --record_unrolls keeps what it recorded
            self.recorder.write()
        # Under FSDP every rank takes part (the optimizer state is gathered), so not after a rank failed.
        final_checkpoint = (self.run_state.save(together=stopped_together or not self.ranks)
                            if stopped_together or not self.sharded else None)
        summaries.close()
        self.eval_results.close()
        if self.ranks:
            self.ranks.close(abandoned=failed)
        return final_checkpoint

    # ----- the data path -----

    def train_step(self, batch: UnrollBatch | None, started: float) -> bool:
        """One turn of the training loop, on `batch` (None: the queue stopped) taken from
        the queue since `started`; False when the run ends here, every learner rank together."""
        agreed = self.fleet.exchange(batch is None or self.stop.is_set(), self.run_state.checkpoint_due())
        if agreed.stop:
            self.finish(self.stop_conditions.reason_to_stop() or "another learner rank stopped")
            return False
        waited = time.monotonic() - started
        if not self.config.train:
            return True
        self.lr_schedule.apply(self.optimizer, self.fleet.counts().env_steps, self.policy.version)
        self.scalars.add_all(self.trainer.update(batch))
        # The share of the trainer's time spent waiting for data.
        self.scalars.add("learner/trainer_idle_fraction", waited / max(time.monotonic() - started, 1e-9))
        if agreed.checkpoint:
            self.run_state.save()
        return True

    def finish(self, reason: str) -> None:
        """Ends the run: the first reason given is the one reported."""
        if not self.stop.is_set():
            self._reason = reason
            self.stop.set()

    def _emit_unroll(self, unroll: Unroll) -> bool:
        """A finished unroll, through the algorithm's hook, to the trainer's queue; False once stopping."""
        return all(self.unrolls.put(ready) for ready in self.unroll_hook.process(unroll))

    def _eval_snapshot(self) -> tuple[torch.nn.Module, int]:
        with self.policy.lock:
            return frozen_copy(self.agent), self.policy.version

    def gauges(self) -> dict[str, float]:
        """The levels each summary writes as they are."""
        return {
            "learner/connected_actors": len(self.actors),
            "learner/dropped_partial_unrolls": self.store.dropped_partial_unrolls,
            "learner/restarted_envs": self.store.restarted_envs,
            "learner/resent_steps": self.step_ledger.resent,
            "learner/disputed_episodes": self.served.train.accounts.disputed,
            "learner/unvouched_episodes": self.served.train.accounts.unvouched,
            "learner/failed_checkpoint_writes": self.run_state.failed_checkpoint_writes,
            "learner/failed_eval_writes": self.eval_results.failed_writes,
            "learner/policy_version": self.policy.version,
            "learner/episodes": self.fleet.counts().episodes,
            **self.agent.inference_metrics(),  # a generating agent's tokens/s, say
        }

    # ----- what the service, the launchers and the debug run read (served_run.RunControl) -----

    def policy_version(self) -> int:
        return self.policy.version

    def is_finished(self) -> bool:
        return self.stop.is_set()

    def finished_reason(self) -> str:
        return self._reason

    def uptime_s(self) -> float:
        return time.monotonic() - self._started

    def status(self) -> pb.Status:
        return run_status(self)

    def summary(self) -> RunSummary:
        return run_summary(self)

