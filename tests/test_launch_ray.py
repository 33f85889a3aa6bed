"""launch.ray on a real Ray cluster: a head and a second worker node, both on this machine.

The head node alone carries the `fleetrl_learner_node` resource, and each node has room
for one 1-CPU actor next to it, so the learner lands on the head and the two actors on
different nodes. The cluster is started with the `ray` CLI as a user would (`ray start
--block`, each node in a session of its own), and stopped by ending those sessions' process
groups: only the processes this test started, not every Ray process of the user, which is
what `ray stop --force` would end.
"""

import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import grpc
import pytest

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

# A real two-node cluster, started once for the module, in a network namespace of loopback
# only: tests/test_ray_in_loopback_netns.py runs this module there (conftest keeps it from
# running anywhere else).
pytestmark = [pytest.mark.slow, pytest.mark.file_fixture, pytest.mark.loopback_netns]

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_session(node: subprocess.Popen) -> None:
    """Ends a node: `ray start --block` and everything it started share its process group."""
    for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            node.poll()  # reaps the node's own process: until then its zombie keeps the group alive
            try:
                os.killpg(node.pid, 0)
            except ProcessLookupError:
                node.wait()
                return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    temp_dir = f"/tmp/ray-{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths must stay under 108 bytes
    port = _free_port()
    logs = tmp_path_factory.mktemp("ray-nodes")
    common = ["--disable-usage-stats", "--object-store-memory=100000000", "--block"]
    nodes = []

    def start(name: str, *flags: str) -> None:
        nodes.append(subprocess.Popen([RAY, "start", *flags, *common], env=ENV, start_new_session=True,
                                      stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT))

    try:
        start("head", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={temp_dir}", "--include-dashboard=false",
              '--resources={"fleetrl_learner_node": 1}')
        wait_until(lambda: _cluster_nodes(f"127.0.0.1:{port}") >= 1, 120, "the head node")
        start("worker", f"--address=127.0.0.1:{port}", "--num-cpus=1")
        wait_until(lambda: _cluster_nodes(f"127.0.0.1:{port}") >= 2, 120, "the worker node")
        yield f"127.0.0.1:{port}"
    finally:
        for node in reversed(nodes):
            _stop_session(node)


def _cluster_nodes(address: str) -> int:
    """Nodes alive in the cluster, as the ray CLI sees them."""
    status = subprocess.run([RAY, "status", f"--address={address}"], env=ENV, capture_output=True, text=True)
    return len(re.findall(r"^\s*1 node_", status.stdout, re.M)) if status.returncode == 0 else 0


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)


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
         f"--logdir={logdir}", "--num_actors=2", "--envs_per_actor=8", "--progress_interval_s=0.5", "--bind=127.0.0.1",
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


def read_until_trainer_passes(process, steps: int, lines: list[str]) -> None:
    """Reads progress lines until one shows more than `steps` trainer steps."""
    while int(read_until(process, r"trainer (\d+) \|", lines).group(1)) <= steps:
        pass


def test_a_run_trains_with_actors_on_both_nodes_and_leaves_nothing_behind(cluster, tmp_path):
    """With a token (the learner refuses calls without it, so training shows it reached every
    actor) and an eval actor, which asks for no CPU of its own here. The run ends at the first
    eval round whose mean return reaches 30 (random play: about 22), so it ends only after
    the eval actor has played, however slowly its process started; an env-step budget
    alone once ended the run first while other tests loaded the machine."""
    token = tmp_path / "token"
    token.write_text(uuid.uuid4().hex)
    process = start_launcher(cluster, tmp_path / "run", "--target_eval_metric=30", "--total_env_steps=1000000",
                             f"--auth_token_file={token}", "--log_to_driver",
                             "--num_eval_actors=1", "--eval_envs_per_actor=4", '--eval_actor_resources={"CPU": 0}',
                             "--eval_interval_s=1", "--hparams=eval_episodes=4")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    nodes = dict(re.findall(r"^(actor-\d) started: pid \d+ on node (\w+)", output, re.M))
    learner_node = re.search(r"learner \(pid \d+\) on node (\w+)", output).group(1)
    assert set(nodes) == {"actor-0", "actor-1"} and len(set(nodes.values())) == 2, output
    assert learner_node in nodes.values()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"].startswith("target reached: eval return") and summary["trainer_steps"] > 0, summary
    assert "eval-actor-0 started" in output
    rounds = (tmp_path / "run" / "eval.jsonl").read_text().splitlines()
    assert rounds and json.loads(rounds[0])["episodes"] == 4, rounds
    # The learner's own log: in its logdir, as launch.local keeps it, and here with --log_to_driver.
    log = (tmp_path / "run" / "logs" / "learner.log").read_text()
    assert "joined: train, " in log and "joined: eval, 4 envs" in log, log
    assert "joined: train, " in output
    assert fleetrl_ray_processes() == []


def listening_sockets() -> list[str]:
    """The addresses of this network namespace's listening TCP sockets, as ip:port."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state != "0A":  # LISTEN
                    continue
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                # /proc writes each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                host = ipaddress.ip_address(words)
                host = getattr(host, "ipv4_mapped", None) or host  # ::ffff:127.0.0.1, a dual-stack socket's
                found.append(f"{host}:{int(port, 16)}")
    return found


def test_the_clusters_servers_listen_on_loopback_only(cluster, tmp_path):
    """While the cluster and a run's learner and actors are up, every listening socket (Ray's
    own, the learner's) is on loopback: the namespace has no other interface, and nothing
    listens on an address but loopback's or a wildcard that there means loopback only."""
    with open("/proc/self/net/dev") as f:  # this namespace's interfaces (/sys shows the host's)
        interfaces = [line.split(":")[0].strip() for line in f.readlines()[2:]]
    assert interfaces == ["lo"], interfaces
    lines: list[str] = []
    with running_launcher(cluster, tmp_path / "run") as process:
        address = read_until(process, r"serving (\S+), logdir", lines).group(1)
        assert address.startswith("127.0.0.1:"), address  # --bind=127.0.0.1: what actors dial
        read_until(process, r"trainer [1-9]", lines)
        sockets = listening_sockets()
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
    assert address in sockets
    for socket_address in sockets:
        host = ipaddress.ip_address(socket_address.rsplit(":", 1)[0])
        assert host.is_loopback or host.is_unspecified, sockets


def test_ray_restarts_a_killed_actor_which_rejoins_and_ctrl_c_stops_everything(cluster, tmp_path):
    """With no token of the user's: the run makes its own, so a client with the proto alone
    is refused, and the actors (a restarted one included) get it through Ray."""
    lines: list[str] = []
    with running_launcher(cluster, tmp_path / "run", "--max_restarts=2") as process:
        address = read_until(process, r"serving (\S+), logdir", lines).group(1)
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.LearnerStub(channel).GetRunInfo(pb.RunInfoRequest(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
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


def test_ray_restarts_a_killed_learner_which_resumes_its_checkpoint_and_the_actors_rejoin(cluster, tmp_path):
    lines: list[str] = []
    checkpoints = tmp_path / "run" / "checkpoints"
    # The kill comes after 100 trainer steps; the run ends by Ctrl-C once the resumed learner
    # has trained on. (An env-step budget raced the kill: Ray forwards the progress lines
    # seconds late on a loaded machine, and a budget once ran out before the kill came.)
    with running_launcher(cluster, tmp_path / "run", "--total_env_steps=100000000", "--checkpoint_every_steps=20",
                          "--learner_max_restarts=1") as process:
        pid = int(read_until(process, r"learner \(pid (\d+)\) on node", lines).group(1))
        read_until(process, r"trainer [1-9]\d\d+ \| actors 2", lines)  # checkpoints written, both actors in
        written = max(int(p.stem.split("-")[1]) for p in checkpoints.glob("ckpt-*.pt"))
        os.kill(pid, signal.SIGKILL)
        restart = read_until(process, r"learner restarted: pid (\d+) on node \w+, resumed from (\S+) at trainer "
                                      r"step (\d+)", lines)
        new_pid, resumed_from, resumed_steps = int(restart.group(1)), restart.group(2), int(restart.group(3))
        assert new_pid != pid and resumed_from.startswith(str(checkpoints)) and resumed_steps >= written, lines
        # Training goes on from there, with both actors back (they reconnect by themselves).
        progress = read_until(process, r"trainer (\d+) \| actors 2", lines)
        assert int(progress.group(1)) >= resumed_steps
        read_until_trainer_passes(process, resumed_steps, lines)
        process.send_signal(signal.SIGINT)
        output = "".join(lines) + process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"] == "stopped by Ctrl-C" and summary["trainer_steps"] > resumed_steps, summary
    assert fleetrl_ray_processes() == []


def test_learner_ranks_share_a_placement_group_and_restart_together_when_one_dies(cluster, tmp_path):
    """Two ranks of half a CPU each, both on the head (the learner-node resource), an actor
    on each; rank 1's process is killed, and every rank restarts from rank 0's checkpoint.
    Ctrl-C ends the run once the restarted ranks train on; both stop at the same step."""
    lines: list[str] = []
    logdir = tmp_path / "run"
    with running_launcher(cluster, logdir, "--learner_ranks=2", "--total_env_steps=100000000",
                          "--checkpoint_every_steps=10", "--learner_max_restarts=1",
                          '--learner_resources={"CPU": 0.5, "fleetrl_learner_node": 0.5}') as process:
        nodes = [read_until(process, rf"learner rank {r} \(pid (\d+)\) on node (\w+)", lines) for r in range(2)]
        assert nodes[0].group(2) == nodes[1].group(2)  # one placement group, packed on the head
        read_until(process, r"trainer ([3-9]\d|\d{3,}) \|", lines)  # checkpoints written
        os.kill(int(nodes[1].group(1)), signal.SIGKILL)
        read_until(process, r"learner rank [01].*; restarting every learner rank from the latest checkpoint", lines)
        restart = read_until(process, r"learner ranks restarted: pid (\d+), (\d+) on node \w+, resumed from (\S+) "
                                      r"at trainer step (\d+)", lines)
        assert {int(restart.group(1)), int(restart.group(2))}.isdisjoint(int(n.group(1)) for n in nodes)
        assert restart.group(3).startswith(str(logdir / "checkpoints")) and int(restart.group(4)) > 0
        read_until_trainer_passes(process, int(restart.group(4)), lines)
        process.send_signal(signal.SIGINT)
        output = "".join(lines) + process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["reason"] == "stopped by Ctrl-C", summary
    assert summary["trainer_steps"] > int(restart.group(4))
    rank1 = json.loads((logdir / "rank1" / "summary.json").read_text())
    assert (rank1["trainer_steps"], rank1["env_steps"]) == (summary["trainer_steps"], summary["env_steps"])
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


def test_actors_that_ray_cannot_place_are_reported_and_none_placed_fails_the_launch(cluster, tmp_path):
    """Each actor asks more CPUs than any node has: after --placement_timeout_s the launcher
    names them with what they ask and what is free, and ends the launch (it used to show
    "actors 0" for as long as the run lasted)."""
    process = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.ray", f"--address={cluster}", f"--logdir={tmp_path / 'run'}",
         "--problem=cartpole", "--num_actors=2", '--actor_resources={"CPU": 64}', "--placement_timeout_s=5",
         '--learner_resources={"CPU": 1, "fleetrl_learner_node": 1}', "--total_env_steps=100000"],
        capture_output=True, text=True, env=ENV, timeout=300)
    output = process.stdout + process.stderr
    assert process.returncode == 1, output
    for name in ("actor-0", "actor-1"):
        assert f"{name} is not placed after 5s: it asks {{'CPU': 64}}, and the cluster has" in output, output
    assert "done: Ray placed no train actor" in output
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
    ("--learner_ranks=2 --learner_resources={}", "--learner_ranks places each rank in a bundle of --learner_resources"),
])
def test_a_bad_flag_is_refused_before_touching_the_cluster(flag, message):
    process = subprocess.run([sys.executable, "-m", "fleetrl.launch.ray", "--address=127.0.0.1:1", *flag.split(" ")],
                             capture_output=True, text=True, env=ENV, timeout=60)
    assert process.returncode == 2
    assert message in process.stderr
