"""A learner started by hand (`launch.learner`) shows what happens to it: a progress line,
each actor that joins or leaves, and refused calls, rate-limited."""

import signal
import subprocess
import sys
import time

import grpc

from fleetrl.actor.actor import Actor
from fleetrl.actor.channel import learner_channel
from fleetrl.actor.config import ActorConfig
from fleetrl.learner.transport.refusal_log import RefusalLog
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc


def test_a_learner_started_by_hand_shows_progress_actors_and_refusals(tmp_path, repo_root):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    logdir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "fleetrl.launch.learner", "--problem=cartpole",
                                f"--logdir={logdir}", "--bind=127.0.0.1:0", f"--auth_token_file={token}",
                                "--progress_interval_s=0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=repo_root)
    try:
        address_file = logdir / "learner_address"
        deadline = time.monotonic() + 120
        while not address_file.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
            time.sleep(0.1)
        address = address_file.read_text().strip()
        for _ in range(3):  # three calls without the token: one line, the others counted in it later
            channel = learner_channel(address, 1 << 20)
            try:
                pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=10)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED
            channel.close()
        actor = Actor(ActorConfig(learner_address=address, num_envs=4, actor_id="by-hand",
                                  auth_token_file=str(token)))
        actor.run(max_steps=30)
        time.sleep(1.0)  # a few progress intervals
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "actor 'by-hand' joined: train, 4 envs (1 actors connected)" in output
    assert "actor 'by-hand' left (0 actors connected)" in output
    assert output.count("refused: UNAUTHENTICATED: a call to /fleetrl.Learner/GetStatus") == 1, output
    assert "env steps" in output and "| actors " in output  # the progress line, as launch.local's


def test_refusals_are_logged_once_a_minute_per_kind_with_the_count_between(caplog):
    now = [0.0]
    refusals = RefusalLog(interval_s=60, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="fleetrl.learner.transport.refusal_log"):
        for t in (0, 1, 2, 30, 61, 62):
            now[0] = t
            refusals.refused("UNAUTHENTICATED", "no token")
        refusals.refused("FAILED_PRECONDITION", "wrong problem")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused: UNAUTHENTICATED: no token",
                     "refused: UNAUTHENTICATED: no token (3 more refused UNAUTHENTICATED since the last such line)",
                     "refused: FAILED_PRECONDITION: wrong problem"]


def test_a_wildcard_bind_is_written_as_an_address_other_hosts_can_dial():
    """`--bind=0.0.0.0:8686` used to leave "0.0.0.0:8686" in <logdir>/learner_address."""
    import socket

    from fleetrl.learner.transport.serving import dialable_address

    for wildcard in ("0.0.0.0:8686", "[::]:8686"):
        dialable = dialable_address(wildcard)
        host, _, port = dialable.rpartition(":")
        assert port == "8686" and host not in ("0.0.0.0", "[::]")
        assert socket.getaddrinfo(host, 8686)  # it resolves here
    assert dialable_address("127.0.0.1:5") == "127.0.0.1:5"
    assert dialable_address("learner.example:5") == "learner.example:5"
    assert dialable_address("unix:/tmp/learner.sock") == "unix:/tmp/learner.sock"
