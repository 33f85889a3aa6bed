"""launch.ray on a real Ray cluster: a head and a second worker node, both on this machine.

The head node alone carries the `fleetrl_learner_node` resource, and each node has room
for one 1-CPU actor next to it, so the learner lands on the head and the two actors on
different nodes. The cluster is started with the `ray` CLI as a user would, and stopped
with `ray stop --force` (which stops every Ray process of this user on the machine).
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.slow  # a real two-node cluster

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    temp_dir = f"/tmp/ray-{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths must stay under 108 bytes
    port = _free_port()
    common = ["--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=100000000"]
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={temp_dir}",
                    '--resources={"fleetrl_learner_node": 1}', *common], check=True, env=ENV, capture_output=True)
    try:
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", "--num-cpus=1", *common[1:]],
                       check=True, env=ENV, capture_output=True)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ENV, capture_output=True)


def fleetrl_ray_processes() -> list[str]:
    """Ray names an actor's process after its class: ray::FleetrlLearner, ray::FleetrlActor."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ray::Fleetrl" in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def start_launcher(cluster, logdir, *flags):
    return subprocess.Popen(
        [sys.executable, "-m", "fleetrl.launch.ray", f"--address={cluster}", "--problem=cartpole",
         f"--logdir={logdir}", "--num_actors=2", "--envs_per_actor=8", "--progress_interval_s=0.5",
         '--learner_resources={"CPU": 1, "fleetrl_learner_node": 1}', '--actor_resources={"CPU": 1}', *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)


@contextlib.contextmanager
def running_launcher(cluster, logdir, *flags):
    """The launcher, killed if a failed check leaves it running."""
    process = start_launcher(cluster, logdir, *flags)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()


def read_until(process, pattern: str, lines: list[str], timeout_s: float = 120) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"no line matching {pattern!r}:\n{''.join(lines)}")


def test_a_run_trains_with_actors_on_both_nodes_and_leaves_nothing_behind(cluster, tmp_path):
    """With a token (the learner refuses calls without it, so training shows it reached every
    actor) and an eval actor, which asks for no CPU of its own here."""
    token = tmp_path / "token"
    token.write_text(uuid.uuid4().hex)
    process = start_launcher(cluster, tmp_path / "run", "--total_env_steps=30000", f"--auth_token_file={token}",
                             "--num_eval_actors=1", "--eval_envs_per_actor=4", '--eval_actor_resources={"CPU": 0}',
                             "--eval_interval_s=1", "--hparams=eval_episodes=4")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    nodes = dict(re.findall(r"^(actor-\d) started: pid \d+ on node (\w+)", output, re.M))
    learner_node = re.search(r"learner on node (\w+)", output).group(1)
    assert set(nodes) == {"actor-0", "actor-1"} and len(set(nodes.values())) == 2, output
    assert learner_node in nodes.values()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"].startswith("total_env_steps reached") and summary["trainer_steps"] > 0, summary
    assert "eval-actor-0 started" in output
    rounds = (tmp_path / "run" / "eval.jsonl").read_text().splitlines()
    assert rounds and json.loads(rounds[0])["episodes"] == 4, rounds
    assert fleetrl_ray_processes() == []


def test_ray_restarts_a_killed_actor_which_rejoins_and_ctrl_c_stops_everything(cluster, tmp_path):
    lines: list[str] = []
    with running_launcher(cluster, tmp_path / "run", "--max_restarts=2") as process:
        pid = int(read_until(process, r"actor-1 started: pid (\d+)", lines).group(1))
        read_until(process, r"trainer [1-9]", lines)  # training is under way
        os.kill(pid, signal.SIGKILL)
        new_pid = int(read_until(process, r"actor-1 restarted \(pid \d+ died\): pid (\d+)", lines).group(1))
        assert new_pid != pid
        read_until(process, rf"actor-1 rejoined the learner: pid {new_pid}, \d+ steps", lines)
        process.send_signal(signal.SIGINT)
        output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "done: stopped by Ctrl-C" in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["trainer_steps"] > 0
    assert fleetrl_ray_processes() == []


def test_the_run_ends_when_its_actors_run_out_of_restarts(cluster, tmp_path):
    lines: list[str] = []
    with running_launcher(cluster, tmp_path / "run", "--max_restarts=0", "--num_actors=1") as process:
        pid = int(read_until(process, r"actor-0 started: pid (\d+)", lines).group(1))
        os.kill(pid, signal.SIGKILL)
        output = "".join(lines) + process.communicate(timeout=120)[0]
    assert process.returncode == 1, output
    assert "actor-0 is gone for good" in output and "done: every actor is out of restarts" in output
    assert fleetrl_ray_processes() == []


def test_a_learner_that_cannot_start_ends_the_launch_with_its_error(cluster, tmp_path):
    """The learner fails on the cluster (its warm-start checkpoint is not on its node)."""
    missing = tmp_path / "no_such_checkpoint.pt"
    process = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.ray", f"--address={cluster}", f"--init_checkpoint={missing}",
         f"--logdir={tmp_path}"], capture_output=True, text=True, env=ENV, timeout=120)
    assert process.returncode == 1
    assert "the learner could not start" in process.stderr and f"no checkpoint file at {missing}" in process.stderr
    assert fleetrl_ray_processes() == []


@pytest.mark.parametrize("flag,message", [
    ("--actor_resources=[1]", "--actor_resources takes a JSON object of amounts"),
    ("--problem=no_such_problem", "unknown problem 'no_such_problem'"),
])
def test_a_bad_flag_is_refused_before_touching_the_cluster(flag, message):
    process = subprocess.run([sys.executable, "-m", "fleetrl.launch.ray", "--address=127.0.0.1:1", flag],
                             capture_output=True, text=True, env=ENV, timeout=60)
    assert process.returncode == 2
    assert message in process.stderr
