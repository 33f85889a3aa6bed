"""Faults in real processes: actors killed and restarted, the learner killed and restarted, SIGTERM."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


class Fleet:
    """A learner and actors started as the user would, with `launch.learner` and `launch.actor`."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.logs = logdir / "test-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.children: list[subprocess.Popen] = []

    def start(self, name: str, module: str, *flags) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "a")
        process = subprocess.Popen([sys.executable, "-m", module, *flags], stdout=log, stderr=subprocess.STDOUT,
                                   cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.children.append(process)
        return process

    def learner(self, address: str, *flags) -> subprocess.Popen:
        return self.start("learner", "fleetrl.launch.learner", f"--bind={address}", f"--logdir={self.logdir}", *flags)

    def actor(self, address: str, actor_id: str, *flags) -> subprocess.Popen:
        return self.start(actor_id, "fleetrl.launch.actor", f"--learner_address={address}", f"--actor_id={actor_id}",
                          "--num_envs=16", *flags)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def stop(self):
        for process in self.children:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def fleet(tmp_path):
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.stop()


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def status(address: str) -> pb.Status | None:
    with grpc.insecure_channel(address) as channel:
        try:
            return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=2)
        except grpc.RpcError:
            return None


@pytest.mark.slow
def test_training_reaches_its_threshold_while_actors_are_killed_and_restarted(fleet, tmp_path):
    address = free_address()
    learner = fleet.learner(address, "--problem=cartpole", "--seed=1", "--total_env_steps=600000",
                            "--target_mean_return=400", "--summary_interval_s=1")
    names = {i: f"actor-{i}-0" for i in range(2)}
    actors = {i: fleet.actor(address, names[i], f"--seed={i}") for i in range(2)}
    rng = np.random.default_rng(0)
    kills = 0
    while learner.poll() is None:
        time.sleep(rng.uniform(2, 4))
        if learner.poll() is not None:
            break
        victim = int(rng.integers(len(actors)))
        actors[victim].send_signal(signal.SIGKILL)
        actors[victim].wait()
        kills += 1
        # A restarted actor is a new process: new id (hostname:pid by default), new run ids.
        names[victim] = f"actor-{victim}-{kills}"
        actors[victim] = fleet.actor(address, names[victim], f"--seed={100 + kills}")
    assert learner.wait() == 0, fleet.log("learner")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target_reached"] and kills >= 3, (summary, kills)
    for i, process in actors.items():
        if "connected to" in fleet.log(names[i]):  # not one started just as the run ended
            assert process.wait(timeout=30) == 0  # the learner told the survivors the run is over
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert max(e.value for e in events.Scalars("learner/dropped_partial_unrolls")) > 0
    assert max(e.value for e in events.Scalars("learner/connected_actors")) == 2


@pytest.mark.slow
def test_actors_wait_for_a_restarted_learner_which_resumes_and_then_stops_cleanly_on_sigterm(fleet, tmp_path,
                                                                                              eventually):
    address = free_address()
    flags = ("--problem=cartpole", "--checkpoint_every_steps=20", "--summary_interval_s=1")
    learner = fleet.learner(address, *flags)
    actors = [fleet.actor(address, f"actor-{i}", "--max_reconnect_s=60") for i in range(2)]
    eventually(lambda: (s := status(address)) and s.trainer_steps >= 60, 120, "training to start")
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    time.sleep(2)  # the actors retry meanwhile
    assert all(actor.poll() is None for actor in actors)

    learner = fleet.learner(address, *flags)
    resumed = eventually(lambda: (s := status(address)) and s.connected_actors == 2 and s, 60,
                       "the same actors to reconnect")
    assert resumed.trainer_steps >= 40  # from the checkpoint, not from 0
    first = resumed.env_steps
    eventually(lambda: (s := status(address)) and s.env_steps > first + 20000, 120, "training to continue")
    assert "resumed from" in fleet.log("learner")
    for i in range(2):
        assert "retrying in" in fleet.log(f"actor-{i}")  # each retry is logged

    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0, fleet.log("learner")
    for actor in actors:
        assert actor.wait(timeout=30) == 0, "an actor did not exit cleanly when the run ended"
    checkpoints = sorted((tmp_path / "checkpoints").glob("ckpt-*.pt"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert checkpoints[-1].name == f"ckpt-{summary['trainer_steps']:010d}.pt"  # the final one
    assert summary["reason"] == "stopped by SIGTERM"


def env_processes(actor: subprocess.Popen) -> list[int]:
    """The actor's env processes (spawned by multiprocessing; not its resource tracker)."""
    children = pathlib.Path(f"/proc/{actor.pid}/task/{actor.pid}/children").read_text().split()
    commands = {pid: pathlib.Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children}
    return sorted(int(pid) for pid, command in commands.items()
                  if b"spawn_main" in command and b"resource_tracker" not in command)


@pytest.mark.slow
def test_a_killed_env_process_ends_only_its_own_episode_and_the_episode_counts_stay_exact(fleet, tmp_path,
                                                                                          eventually):
    address = free_address()
    # Two envs step a few hundred times a second: the 8k env steps after the kill are 100s of episodes.
    learner = fleet.learner(address, "--problem=cartpole", "--seed=2", "--total_env_steps=10000",
                            "--summary_interval_s=1")
    actor = fleet.start("actor", "fleetrl.launch.actor", f"--learner_address={address}", "--actor_id=actor",
                        "--num_envs=2", "--async_envs")
    eventually(lambda: (s := status(address)) and s.env_steps >= 2000, 120, "the actor to step its envs")
    envs = env_processes(actor)
    assert len(envs) == 2, envs
    os.kill(envs[1], signal.SIGKILL)
    assert learner.wait(timeout=300) == 0, fleet.log("learner")
    assert actor.wait(timeout=30) == 0, fleet.log("actor")  # the run went on to its end
    assert "env 1's process died (exit code -9)" in fleet.log("actor")
    assert "envs [1] restarted after their process died" in fleet.log("actor")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] >= 10000
    reached = int(re.search(r"\((\d+) episodes reached it\)", fleet.log("actor")).group(1))
    assert summary["episodes"] == reached  # the lost episode was counted nowhere, every other once
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert max(e.value for e in events.Scalars("learner/restarted_envs")) == 1
    assert max(e.value for e in events.Scalars("learner/dropped_partial_unrolls")) >= 1
