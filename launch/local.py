"""Everything on one machine: `python -m fleetrl.launch.local --problem=cartpole`.

Starts the learner, --num_actors actor processes, --num_eval_actors eval actors (and TensorBoard with
--tensorboard_port), shows a live progress line read from the learner's GetStatus RPC,
and stops everything when the learner ends the run, on Ctrl-C, or when a child crashes.
Children's logs go to <logdir>/logs/. Exit code: the learner's (0, or 1 when a target
return was set and not reached), or 1 if a process crashed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time

import grpc
from absl import app, flags

from fleetrl.actor.config import ActorConfig
from fleetrl.launch.flags import (
    define_flags,
    define_problem_flags,
    launch_flags_with_problem_defaults,
    learner_config_from_flags,
    timestamped_logdir,
    to_argv,
)
from fleetrl.launch.processes import ChildProcesses
from fleetrl.launch.progress import Progress, print_summary
from fleetrl.learner.config import LearnerConfig
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

define_flags(LearnerConfig, skip=("bind",))
flags.DEFINE_integer("num_actors", 2, "Actor processes to start.")
flags.DEFINE_integer("envs_per_actor", 32, "Envs each actor steps.")
flags.DEFINE_boolean("async_envs", False, "Actors step their envs in subprocesses.")
flags.DEFINE_integer("num_eval_actors", 0, "Eval actor processes: they play the Problem's eval set each eval round.")
flags.DEFINE_integer("eval_envs_per_actor", 8, "Envs each eval actor plays at once.")
flags.DEFINE_float("max_reconnect_s", 60.0, "Actors give up after this long without the learner.")
flags.DEFINE_integer("tensorboard_port", 0, "Also start TensorBoard on this port (0: don't).")
flags.DEFINE_float("progress_interval_s", 1.0, "Seconds between progress updates.")
FLAGS = flags.FLAGS


@dataclasses.dataclass
class LocalConfig:
    learner: LearnerConfig
    num_actors: int
    envs_per_actor: int
    async_envs: bool
    max_reconnect_s: float
    num_eval_actors: int
    eval_envs_per_actor: int
    tensorboard_port: int
    progress_interval_s: float


def launch(config: LocalConfig) -> int:
    learner_cfg = config.learner
    os.makedirs(learner_cfg.logdir, exist_ok=True)
    logs = os.path.join(learner_cfg.logdir, "logs")
    address_file = os.path.join(learner_cfg.logdir, "learner_address")
    if os.path.exists(address_file):
        os.remove(address_file)
    children = ChildProcesses()
    python = [sys.executable, "-m"]
    stop_requested = []
    signal.signal(signal.SIGINT, lambda *_: stop_requested.append("Ctrl-C"))
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append("SIGTERM"))
    progress = Progress(sys.stdout.isatty())
    try:
        learner = children.start("learner", python + ["fleetrl.launch.learner", *to_argv(learner_cfg)],
                                 os.path.join(logs, "learner.log"))
        address = _wait_for_address(address_file, learner)
        if address is None:
            print(f"the learner exited before serving:\n{learner.tail()}", file=sys.stderr)
            return 1
        actors = [
            children.start(f"actor-{i}", python + ["fleetrl.launch.actor", *to_argv(ActorConfig(
                learner_address=address, problem=learner_cfg.problem, num_envs=config.envs_per_actor,
                actor_id=f"local-{i}", seed=learner_cfg.seed * 1000 + i, async_envs=config.async_envs,
                max_reconnect_s=config.max_reconnect_s))], os.path.join(logs, f"actor-{i}.log"))
            for i in range(config.num_actors)
        ] + [
            children.start(f"eval-actor-{i}", python + ["fleetrl.launch.actor", *to_argv(ActorConfig(
                learner_address=address, problem=learner_cfg.problem, num_envs=config.eval_envs_per_actor,
                actor_id=f"local-eval-{i}", mode="eval", max_reconnect_s=config.max_reconnect_s))],
                os.path.join(logs, f"eval-actor-{i}.log"))
            for i in range(config.num_eval_actors)
        ]
        if config.tensorboard_port and shutil.which("tensorboard"):
            children.start("tensorboard", ["tensorboard", f"--logdir={learner_cfg.logdir}",
                                           f"--port={config.tensorboard_port}"], os.path.join(logs, "tensorboard.log"))
        evals = f", {config.num_eval_actors} eval actors" if config.num_eval_actors else ""
        print(f"fleetrl: {learner_cfg.problem} on {address}, {config.num_actors} actors x "
              f"{config.envs_per_actor} envs{evals}; logs in {logs}")
        crashed = []
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.LearnerStub(channel)
            while True:
                if stop_requested:
                    progress.end()
                    print(f"{stop_requested[0]}: stopping")
                    children.stop([learner])  # the learner ends its streams; actors then exit 0
                    break
                crashed = [c for c in children.exited() if c is not learner and c.process.returncode != 0]
                if crashed or learner.process.poll() is not None:
                    break
                try:
                    progress.show(stub.GetStatus(pb.StatusRequest(), timeout=2))
                except grpc.RpcError:
                    pass
                time.sleep(config.progress_interval_s)
        progress.end()
        if crashed:
            child = crashed[0]
            print(f"{child.name} exited with code {child.process.returncode}; stopping the run. "
                  f"Last lines of {child.log_path}:\n{child.tail()}", file=sys.stderr)
            return 1
        code = learner.process.wait()
        children.stop(actors, timeout_s=15)
        return _report(learner_cfg.logdir, code, learner, config.tensorboard_port)
    finally:
        children.stop()


def _wait_for_address(path: str, learner) -> str | None:
    while learner.process.poll() is None:
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip()
        time.sleep(0.1)
    return None


def _report(logdir: str, code: int, learner, tensorboard_port: int) -> int:
    summary_path = os.path.join(logdir, "summary.json")
    if code not in (0, 1) or not os.path.exists(summary_path):
        print(f"the learner exited with code {code}. Last lines of {learner.log_path}:\n{learner.tail()}",
              file=sys.stderr)
        return code or 1
    with open(summary_path) as f:
        print_summary(json.load(f))
    print(f"TensorBoard: tensorboard --logdir {logdir}" +
          (f"  (running on http://localhost:{tensorboard_port})" if tensorboard_port else ""))
    return code


def main(argv: list[str]) -> int:
    del argv
    learner = learner_config_from_flags(bind="127.0.0.1:0")
    if FLAGS["logdir"].using_default_value:
        learner = dataclasses.replace(learner, logdir=timestamped_logdir(learner.problem))
    given = launch_flags_with_problem_defaults(("num_actors", "envs_per_actor", "eval_envs_per_actor"))
    return launch(LocalConfig(
        learner=learner, num_actors=given["num_actors"], envs_per_actor=given["envs_per_actor"],
        async_envs=FLAGS.async_envs, max_reconnect_s=FLAGS.max_reconnect_s,
        num_eval_actors=FLAGS.num_eval_actors, eval_envs_per_actor=given["eval_envs_per_actor"],
        tensorboard_port=FLAGS.tensorboard_port, progress_interval_s=FLAGS.progress_interval_s))


def run() -> None:
    define_problem_flags(sys.argv)
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
