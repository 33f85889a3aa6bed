"""Data-parallel learner ranks through the whole system (gloo, processes on this machine):
launch.local --learner_ranks=2 trains CartPole, counts every episode once, resumes with
another number of ranks, and a rank that dies ends the other within the timeout."""

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc


def episodes_reaching_the_learner(logdir) -> int:
    """What the actors say the learner counted of theirs, summed over the fleet."""
    total = 0
    for path in glob.glob(os.path.join(logdir, "logs", "actor-*.log")):
        found = re.findall(r"\((\d+) episodes reached it\)", open(path).read())
        assert found, f"{path} has no closing count"
        total += int(found[-1])
    return total


@pytest.mark.slow
def test_two_ranks_train_cartpole_and_count_each_episode_once(tmp_path, local_run):
    logdir = tmp_path / "run"
    summary = local_run.train_to_target(
        logdir, "--problem=cartpole", "--learner_ranks=2", "--num_actors=4", "--envs_per_actor=16",
        "--num_eval_actors=1", "--total_env_steps=400000", "--target_mean_return=300", "--checkpoint_every_steps=25",
        "--summary_interval_s=1", "--seed=0",
        "--hparams=eval_episodes=16")  # a round the eval actor finishes before the target, however loaded
    assert summary["episodes"] == episodes_reaching_the_learner(logdir)
    rank1 = json.loads((logdir / "rank1" / "summary.json").read_text())
    for key in ("episodes", "env_steps", "trainer_steps"):
        assert rank1[key] == summary[key], (key, rank1, summary)
    scalars = local_run.read_scalars(logdir)
    assert scalars["learner/episodes"][-1] == summary["episodes"]
    # Rank 0 alone writes checkpoints; every eval episode is played once, on rank 0.
    assert len(list((logdir / "checkpoints").glob("ckpt-*.pt"))) >= 1
    assert not (logdir / "rank1" / "checkpoints").exists()
    rounds = [json.loads(line) for line in (logdir / "eval.jsonl").read_text().splitlines()]
    assert rounds and all(r["episodes"] == 16 for r in rounds)
    # The ranks compare their weights at every batch and stop on a difference (RanksDiverged).
    for log in ("learner.log", "learner-rank1.log"):
        assert "RanksDiverged" not in (logdir / "logs" / log).read_text()


@pytest.mark.slow
def test_a_run_resumes_with_another_number_of_ranks(tmp_path, local_run):
    logdir = tmp_path / "run"
    common = ("--problem=cartpole", "--num_actors=2", "--envs_per_actor=16", "--seed=0")
    versions = []
    # All-reduced ranks, one, FSDP ranks (the optimizer state sharded, gathered to save), one.
    legs = ((2, 8000, ()), (1, 16000, ()), (2, 24000, ("--fsdp",)), (1, 32000, ()))
    for ranks, steps, flags in legs:
        process, tag = local_run.start(logdir, *common, f"--learner_ranks={ranks}", f"--total_env_steps={steps}",
                                       *flags)
        code, output = local_run.finish(process, tag)
        assert code == 0, output
        summary = json.loads((logdir / "summary.json").read_text())
        assert summary["env_steps"] >= steps and summary["reason"].startswith("total_env_steps"), summary
        versions.append(summary["trainer_steps"])
        if flags:
            assert "training sharded by FSDP over 2 learner ranks" in (logdir / "logs" / "learner.log").read_text()
    assert versions == sorted(set(versions)), versions
    log = (logdir / "logs" / "learner.log").read_text()
    assert "written by 2 learner rank(s); this run has 1" in log
    assert "written by 1 learner rank(s); this run has 2" in log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_other_with_the_error_named(tmp_path):
    logdir, group = tmp_path / "run", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    processes = []
    try:
        for rank in range(2):
            log = open(tmp_path / f"learner-{rank}.log", "w")
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "fleetrl.launch.learner", "--problem=cartpole", f"--logdir={logdir}",
                 "--bind=127.0.0.1:0", "--world_size=2", f"--rank={rank}", "--collective_timeout_s=5"],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **group}))
        addresses = []
        for rank in range(2):
            path = logdir / ("learner_address" + (f".rank{rank}" if rank else ""))
            deadline = time.monotonic() + 60
            while not path.exists():
                assert time.monotonic() < deadline, (tmp_path / f"learner-{rank}.log").read_text()
                time.sleep(0.1)
            addresses.append(path.read_text().strip())
        for rank, address in enumerate(addresses):
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "fleetrl.launch.actor", f"--learner_address={address}", "--problem=cartpole",
                 "--num_envs=8", f"--actor_id=a{rank}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with grpc.insecure_channel(addresses[0]) as channel:
            stub = pb_grpc.LearnerStub(channel)
            deadline = time.monotonic() + 60
            while stub.GetStatus(pb.StatusRequest(), timeout=5).trainer_steps < 3:
                assert time.monotonic() < deadline, "the ranks did not train"
                time.sleep(0.2)
        processes[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = processes[0].wait(timeout=60)
        ended_after = time.monotonic() - killed
        log = (tmp_path / "learner-0.log").read_text()
        assert code == 4, log
        assert ended_after < 30, ended_after  # the 5 s timeout, and the shutdown after it
        assert "another rank died or did not join within collective_timeout_s=5s" in log, log
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_an_actor_given_the_ranks_addresses_picks_one_by_its_id():
    from fleetrl.actor.actor import ActorError, pick_learner

    ranks = "127.0.0.1:7000, 127.0.0.1:7001,127.0.0.1:7002"
    picked = [pick_learner(ranks, f"host:{pid}") for pid in range(300)]
    assert set(picked) == {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
    assert min(picked.count(a) for a in set(picked)) > 60  # spread over the ranks
    assert all(pick_learner(ranks, f"host:{pid}") == picked[pid] for pid in range(300))  # the same every time
    assert pick_learner("unix:/tmp/learner", "anyone") == "unix:/tmp/learner"
    with pytest.raises(ActorError, match="names no learner"):
        pick_learner(" , ", "a")


@pytest.mark.slow
def test_torchrun_starts_the_learner_ranks_and_actors_find_theirs(tmp_path):
    from fleetrl.actor.actor import pick_learner

    logdir, port = tmp_path / "run", free_port()
    addresses = f"127.0.0.1:{port},127.0.0.1:{port + 1}"
    ids = [f"actor-{i}" for i in range(20)]
    # Two ids that pick different ranks: a rank with no actor would hold the other (lockstep).
    chosen = [next(i for i in ids if pick_learner(addresses, i).endswith(str(port + r))) for r in range(2)]
    torchrun = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node=2",
         f"--master_port={free_port()}", "-m", "fleetrl.launch.learner", "--problem=cartpole", f"--logdir={logdir}",
         f"--bind=127.0.0.1:{port}", "--total_env_steps=4000", "--collective_timeout_s=60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    actors = []
    try:
        deadline = time.monotonic() + 60
        while not (logdir / "learner_address.rank1").exists() or not (logdir / "learner_address").exists():
            assert torchrun.poll() is None and time.monotonic() < deadline, torchrun.stdout.read()
            time.sleep(0.1)
        actors = [subprocess.Popen([sys.executable, "-m", "fleetrl.launch.actor", f"--learner_address={addresses}",
                                    "--num_envs=8", f"--actor_id={actor_id}"], stderr=subprocess.PIPE, text=True)
                  for actor_id in chosen]
        output, _ = torchrun.communicate(timeout=120)
        assert torchrun.returncode == 0, output
        for rank, actor in enumerate(actors):
            _, log = actor.communicate(timeout=30)
            assert f"connected to 127.0.0.1:{port + rank}" in log, log
        summary = json.loads((logdir / "summary.json").read_text())
        assert summary["env_steps"] >= 4000 and summary["reason"].startswith("total_env_steps"), summary
        assert json.loads((logdir / "rank1" / "summary.json").read_text())["env_steps"] == summary["env_steps"]
    finally:
        for process in [torchrun, *actors]:
            if process.poll() is None:
                process.kill()
                process.wait()
