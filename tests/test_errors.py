"""Mistakes a user makes get one line that names the thing and the fix, and a non-zero exit:
never a traceback. Each case runs the real entry point in its own process."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

WRONG_AGENT = textwrap.dedent("""
    from fleetrl.agents import MLPAgent
    from fleetrl.problems.cartpole import CartPoleProblem

    class WrongAgent(CartPoleProblem):
        def make_agent(self):
            return MLPAgent(5, 2, (16,))  # CartPole's observations have 4 numbers, not 5
""")


def run(module, *flags, cwd, pythonpath=None, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else None
    result = subprocess.run([sys.executable, "-m", module, *flags], capture_output=True, text=True, cwd=cwd,
                            timeout=timeout, env=env)
    return result.returncode, result.stdout + result.stderr


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(code, output, *expected):
    assert code != 0, output
    assert "Traceback" not in output, output
    for text in expected:
        assert text in output, output


def test_a_logdir_that_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("")
    code, output = run("fleetrl.launch.local", f"--logdir={tmp_path / 'taken'}", cwd=tmp_path)
    check(code, output, f"--logdir={tmp_path / 'taken'} is a file, not a folder")


def test_a_learner_port_in_use(tmp_path, busy_port):
    code, output = run("fleetrl.launch.learner", f"--bind=127.0.0.1:{busy_port}", f"--logdir={tmp_path}",
                       cwd=tmp_path)
    check(code, output, f"cannot serve on --bind=127.0.0.1:{busy_port}: the port is in use", "port 0 for any free")


def test_a_second_learner_on_a_live_learners_port_fails_at_start(tmp_path, serve):
    """gRPC sets SO_REUSEPORT by default: a second learner on a live one's --bind would
    start and take half the fleet. It must fail at start instead, naming the port."""
    address = serve().address
    code, output = run("fleetrl.launch.learner", f"--bind={address}", f"--logdir={tmp_path / 'second'}",
                       cwd=tmp_path)
    check(code, output, f"cannot serve on --bind={address}: the port is in use")


def test_an_unknown_hparam_suggests_the_known_one(tmp_path):
    code, output = run("fleetrl.launch.learner", "--hparams=learning_rat=1e-3", f"--logdir={tmp_path}",
                       "--bind=127.0.0.1:0", cwd=tmp_path)
    check(code, output, "unknown hparams ['learning_rat']", "did you mean 'learning_rate'")


def test_an_unknown_flag_suggests_the_known_one(tmp_path):
    code, output = run("fleetrl.launch.local", "--batchsize=8", cwd=tmp_path)
    check(code, output, "Unknown command line flag 'batchsize'", "Did you mean: batch_size")


def test_an_agent_sized_wrong_for_its_env_is_named_at_start(tmp_path):
    (tmp_path / "wrong_agent.py").write_text(WRONG_AGENT)
    code, output = run("fleetrl.launch.learner", "--problem=wrong_agent:WrongAgent", f"--logdir={tmp_path / 'run'}",
                       "--bind=127.0.0.1:0", cwd=tmp_path, pythonpath=tmp_path)
    check(code, output, "the agent failed on an observation of the env's spaces ('observation' float32 [4])",
          "do the agent's sizes match the env's observations and actions?")


def test_an_actor_with_no_learner_at_its_address(tmp_path, free_port):
    code, output = run("fleetrl.launch.actor", f"--learner_address=127.0.0.1:{free_port}", "--max_reconnect_s=1",
                       "--problem=cartpole", "--num_envs=1", cwd=tmp_path)
    check(code, output, f"no learner answered at 127.0.0.1:{free_port} for 1s: is one running there?")
