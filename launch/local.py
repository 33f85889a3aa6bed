"""Everything on one machine: `python -m fleetrl.launch.local --problem=cartpole`.

Starts the learner, --num_actors actor processes, --num_eval_actors eval actors (and TensorBoard with
--tensorboard_port), shows a live progress line read from the learner's GetStatus RPC,
and stops everything when the learner ends the run, on Ctrl-C, or when a child crashes.
Children's logs go to <logdir>/logs/. Exit code: the learner's (0; 1 when a target
return was set and not reached; 3 when its final checkpoint could not be written), or 1
if a process crashed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import time

import grpc
from absl import flags, logging

from fleetrl.common.files import atomic_write_json
from fleetrl.launch.configs import FleetConfig, LocalConfig
from fleetrl.launch.flags import (
    define_flags,
    launcher_main,
    run_main,
    to_argv,
)
from fleetrl.launch.processes import ChildProcesses
from fleetrl.launch.progress import Progress, print_next_steps, print_summary, script
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.run.run_files import address_file
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

define_flags(LearnerConfig, skip=("bind",))
define_flags(FleetConfig)
define_flags(LocalConfig, skip=("learner", "fleet"))
FLAGS = flags.FLAGS


def launch(config: LocalConfig) -> int:
    learner_cfg = config.learner
    os.makedirs(learner_cfg.logdir, exist_ok=True)
    logs = os.path.join(learner_cfg.logdir, "logs")
    ranks = config.learner_ranks
    for rank in range(ranks):
        if os.path.exists(address_file(learner_cfg.logdir, rank)):
            os.remove(address_file(learner_cfg.logdir, rank))
    # The launch's own settings start config.json; the learner adds its own and the Problem's.
    atomic_write_json(os.path.join(learner_cfg.logdir, "config.json"), {"launch": {
        "launcher": "fleetrl.launch.local", **dataclasses.asdict(config.fleet),
        "tensorboard_port": config.tensorboard_port, "learner_ranks": ranks}}, indent=2)
    children = ChildProcesses()
    python = [sys.executable, "-m"]
    stop_requested = []
    signal.signal(signal.SIGINT, lambda *_: stop_requested.append("Ctrl-C"))
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append("SIGTERM"))
    progress = Progress(sys.stdout.isatty())
    try:
        # Learner ranks meet as torchrun would have them: MASTER_ADDR and MASTER_PORT.
        group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())} if ranks > 1 else {}
        learners = [children.start("learner" + (f"-rank{r}" if r else ""),
                                   python + ["fleetrl.launch.learner", *to_argv(dataclasses.replace(
                                       learner_cfg, world_size=ranks, rank=r))],
                                   os.path.join(logs, "learner" + (f"-rank{r}" if r else "") + ".log"),
                                   env={**group, "LOCAL_RANK": str(r)} if group else {})
                    for r in range(ranks)]
        learner = learners[0]
        addresses = [_wait_for_address(address_file(learner_cfg.logdir, r), learners[r]) for r in range(ranks)]
        if None in addresses:
            failed = learners[addresses.index(None)]
            print(f"{failed.name} exited before serving:\n{failed.tail()}", file=sys.stderr)
            return 1
        address = addresses[0]
        actors = []
        for name, actor_config in config.fleet.actor_configs(learner_cfg, address, id_prefix="local-",
                                                             rank_addresses=addresses):
            actors.append(children.start(name, python + ["fleetrl.launch.actor", *to_argv(actor_config)],
                                         os.path.join(logs, f"{name}.log")))
        if config.tensorboard_port:  # this environment's own, whether or not it is on PATH
            children.start("tensorboard", [script("tensorboard"), f"--logdir={learner_cfg.logdir}",
                                           f"--port={config.tensorboard_port}"], os.path.join(logs, "tensorboard.log"))
        fleet = config.fleet
        evals = f", {fleet.num_eval_actors} eval actors" if fleet.num_eval_actors else ""
        on = address if ranks == 1 else f"{ranks} learner ranks ({', '.join(addresses)})"
        print(f"fleetrl: {learner_cfg.problem} on {on}, {fleet.num_actors} actors x "
              f"{fleet.envs_per_actor} envs{evals}; logs in {logs}")
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
        children.stop(learners[1:] + actors, timeout_s=15)  # the other ranks end at the same batch as rank 0
        return _report(learner_cfg, code, learner, config.tensorboard_port)
    finally:
        children.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_address(path: str, learner) -> str | None:
    while learner.process.poll() is None:
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip()
        time.sleep(0.1)
    return None


def _report(learner_cfg: LearnerConfig, code: int, learner, tensorboard_port: int) -> int:
    logdir = learner_cfg.logdir
    summary_path = os.path.join(logdir, "summary.json")
    if code not in (0, 1) or not os.path.exists(summary_path):
        print(f"the learner exited with code {code}. Last lines of {learner.log_path}:\n{learner.tail()}",
              file=sys.stderr)
        return code or 1
    with open(summary_path) as f:
        print_summary(json.load(f))
    try:  # to fit the printed eval command to the Problem; the run is over whatever this says
        problem = load_problem(learner_cfg.problem, learner_cfg.hparams)
    except Exception as e:
        logging.warning("the next commands assume defaults: the Problem did not load here (%s)", e)
        problem = None
    print_next_steps(logdir, tensorboard_port, learner_cfg.problem, problem)
    return code


def main(argv: list[str]) -> int:
    del argv
    return launcher_main(LocalConfig, "127.0.0.1:0", launch)


def run() -> None:
    run_main(main, __doc__, problem_flags=True)


if __name__ == "__main__":
    run()
