"""The whole run in the caller's process, on one thread: for stepping through a Problem.

The learner's parts are a `TrainingRun`'s, the same objects the served learner drives, and
the actors' are theirs (`EnvGroup`, `EvalEpisodes`); only the driver differs. Each turn:

1. every actor's env groups, in order (actor 0's first group first), make their Step
   messages, and `StepIntake` takes each in as the learner's service would (the same
   checks, the same episode statistics);
2. one inference over all of them (`InferenceStep`, which assembles unrolls);
3. each group steps its envs with its actions;
4. while the unroll queue holds a batch: one update (`TrainingRun.train_step`); every
   `summary_every_updates` the summaries, every `eval_every_updates` a whole eval round,
   played here by the eval actors' envs before training goes on.

No gRPC, no threads, no subprocesses (envs step in this process even where the Problem
asks for subprocesses), and no clock in any decision: with the same seed two runs are
bit-identical. Messages are still encoded and decoded as on the wire, so a wrong shape
fails as it would in a served run, naming the field. What differs from a served run:
nothing overlaps (no double buffering, no inference during an update), so the policy lag
is fixed by the schedule above; the unroll queue never blocks (it is unbounded).
"""

from __future__ import annotations

import bdb
import dataclasses
import logging
import os
import sys
import time

import torch

from fleetrl.actor.actor import eval_step_message, handshake_message
from fleetrl.actor.config import ActorConfig
from fleetrl.actor.env_groups import EnvGroup, env_actions, group_bounds, make_env_groups
from fleetrl.actor.eval_episodes import EvalEpisodes
from fleetrl.envs.vector import make_vector_env
from fleetrl.launch.configs import DebugConfig
from fleetrl.launch.progress import Progress
from fleetrl.learner.run.run_files import RunSummary, write_summary
from fleetrl.learner.run.summaries import TrainSummaries
from fleetrl.learner.run.training_run import TrainingRun
from fleetrl.learner.transport.step_intake import StepIntake
from fleetrl.problems.base import Problem
from fleetrl.problems.eval_records import eval_records
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.run_ids import new_run_ids
from fleetrl.proto.tensors import decode_all, encode_all

log = logging.getLogger(__name__)


class DebugActor:
    """A train actor's envs, admitted to the run as the service admits a stream."""

    def __init__(self, config: ActorConfig, problem: Problem, run: TrainingRun, intake: StepIntake):
        self.actor_id, self.num_envs = config.actor_id, config.num_envs
        refusal = intake.decoder.check_handshake(handshake_message(run.config.problem, problem, self.actor_id,
                                                                   self.num_envs))
        if refusal:
            raise ValueError(f"actor {self.actor_id}: {refusal}")
        group_bounds(self.num_envs, config.env_groups, problem.config.group_size)  # a clear error first

        def vector_env(size: int, first_env: int):
            return make_vector_env(problem.make_actor_env, size, False, problem.config.group_size, config.seed,
                                   first_env=first_env)

        self.groups: list[EnvGroup] = make_env_groups(problem, vector_env, self.num_envs, config.env_groups,
                                                      new_run_ids(self.num_envs), config.seed)
        self.slots = run.store.allocate(self.num_envs)
        run.unroll_hook.actor_joined(self.slots)
        run.actors.join(self.actor_id, pb.TRAIN, float("inf"))

    def close(self) -> None:
        for group in self.groups:
            group.envs.close()


class DebugEvalActor:
    """An eval actor's envs, which play whole eval rounds on request."""

    def __init__(self, config: ActorConfig, problem: Problem, run: TrainingRun, intake: StepIntake):
        self.actor_id, self.num_envs = config.actor_id, config.num_envs
        self.problem, self.run, self.intake = problem, run, intake
        self.episodes = EvalEpisodes(problem, self.num_envs)
        self.slots = run.eval_store.allocate(self.num_envs)
        self.run_ids = new_run_ids(self.num_envs)
        self.send_records = eval_records(problem).learner_writes_eval_records()
        run.actors.join(self.actor_id, pb.EVAL, float("inf"))

    def play_round(self) -> None:
        """Asks for work until a new round is complete; every episode is played here."""
        rounds, action_specs = self.run.eval_rounds, self.problem.action_specs()
        target = rounds.completed + 1
        while rounds.completed < target:
            work = rounds.work(self.actor_id, self.num_envs)
            if not work.episodes:
                raise RuntimeError(f"eval round {target} gave no work: {work}")
            self.episodes.start(work.episodes)
            while self.episodes.playing:
                pending = self.episodes.pending()
                message = eval_step_message(pending, self.run_ids, self.send_records)
                request, finished = self.intake.decode_eval(message, self.slots, self.num_envs)
                (actions,) = self.run.eval_inference([self.intake.eval_request(self.actor_id, request, finished)])
                # An env's last step goes out (with its episode's metrics) before the env goes idle.
                self.episodes.advance(pending, wire_round_trip(actions, action_specs, len(pending.env_indices)))

    def close(self) -> None:
        self.episodes.close()


class DebugRun:
    def __init__(self, config: DebugConfig, problem: Problem | None = None):
        """`problem`: the learner's, and the actors' too (by default each loads its own, as
        actor processes do)."""
        self.config = config
        if config.deterministic:
            if config.learner.device.startswith("cuda"):
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for determinism
            torch.use_deterministic_algorithms(True, warn_only=True)
        learner = dataclasses.replace(config.learner, eval_interval_s=0)  # rounds come by update count
        self.run = TrainingRun(learner, problem, unroll_queue_size=0)
        self.intake = StepIntake(self.run.served)
        self.actors: list[DebugActor] = []
        self.eval_actors: list[DebugEvalActor] = []
        try:
            for _, actor_config in config.fleet.actor_configs(learner, "in-process", id_prefix="debug-"):
                actor_problem = problem or load_problem(learner.problem, learner.hparams)
                kind = DebugEvalActor if actor_config.mode == "eval" else DebugActor
                (self.eval_actors if kind is DebugEvalActor else self.actors).append(
                    kind(actor_config, actor_problem, self.run, self.intake))
        except BaseException:
            self._close_actors()
            raise
        if not self.actors:
            raise ValueError("a debug run needs at least one actor: --num_actors=1 or more")
        self.action_specs = self.run.problem.action_specs()
        self.updates = 0
        self._summaries: TrainSummaries | None = None  # open while run_to_end runs
        self._progress: Progress | None = None

    def step(self) -> None:
        """One turn of every train actor: their steps in, one inference, their actions out."""
        groups = [group for actor in self.actors for group in actor.groups]
        requests = [self.intake.train_request(group.step, actor.slots, actor.num_envs, actor.actor_id)
                    for actor in self.actors for group in actor.groups]
        for group, actions in zip(groups, self.run.inference(requests)):
            group.act(env_actions(wire_round_trip(actions, self.action_specs, group.size), self.action_specs))

    def train(self, max_updates: int | None = None) -> bool:
        """Every batch the queue holds (up to `max_updates` updates in all), one update
        each; False once the run has ended."""
        run, batch_size = self.run, self.run.config.batch_size
        while run.unrolls.qsize() >= batch_size and (max_updates is None or self.updates < max_updates):
            run.scalars.add("learner/unroll_queue_size", run.unrolls.qsize())
            if not run.train_step(run.unrolls.get_batch(batch_size), time.monotonic()):
                return False
            self.updates += 1
            if self._summaries is not None and self.updates % self.config.summary_every_updates == 0:
                self._summaries.write()
                if self._progress is not None:
                    self._progress.show(run.status())
            if self.eval_actors and self.updates % self.config.eval_every_updates == 0:
                for actor in self.eval_actors[:1]:  # one plays the whole round: the order stays fixed
                    actor.play_round()
            if self._stop_if_done():
                return False
        return True

    def run_to_end(self, max_updates: int | None = None) -> RunSummary:
        """Steps and trains until a stop condition (or `max_updates` updates); writes the
        final checkpoint, the summaries and summary.json, as the served learner does."""
        run = self.run
        self._summaries = run.open()
        self._progress = Progress(sys.stdout.isatty()) if self.config.progress else None
        failed = False
        try:
            while not run.is_finished():
                self.step()
                if self._stop_if_done() or not self.train(max_updates):
                    break
                if max_updates is not None and self.updates >= max_updates:
                    run.finish(f"max_updates reached ({max_updates})")
        except bdb.BdbQuit:  # `q` at a breakpoint: a stop, with the final checkpoint
            run.finish("quit from the debugger")
            raise
        except BaseException as e:
            failed = True
            run.finish(f"error: {e!r}")
            raise
        finally:
            run.finish("stopped")
            if self._progress is not None:
                self._progress.end()
            final_checkpoint = run.close(self._summaries, stopped_together=True, failed=failed)
            self._close_actors()
            # At every end, a quit or a crash included, as the served learner writes it.
            summary = dataclasses.replace(run.summary(), final_checkpoint=final_checkpoint)
            write_summary(run.own_logdir, summary)
        return summary

    def _stop_if_done(self) -> bool:
        reason = self.run.stop_conditions.reason_to_stop()
        if reason:
            self.run.finish(reason)
        return self.run.is_finished()

    def _close_actors(self) -> None:
        for actor in [*self.actors, *self.eval_actors]:
            actor.close()


def wire_round_trip(actions: dict, action_specs, count: int) -> dict:
    """The actions as an actor reads them off the wire: encoded and checked against the specs."""
    return decode_all(encode_all(actions), action_specs, count, "action")
