"""`fleetrl.launch.local` end to end, in real processes: learning, user Problems, crashes, Ctrl-C.

Every launcher started here carries a unique environment tag that its children inherit,
so the tests can check that no process of the run is left behind.
"""

import json
import math
import pathlib
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import imageio.v3 as iio
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc


@pytest.mark.slow
def test_cartpole_learns_and_writes_summaries(tmp_path, local_run, repo_root):
    """V-trace through the whole system, for real: a random policy averages about 22."""
    process, tag = local_run.start(tmp_path, "--problem=cartpole", "--num_actors=2", "--envs_per_actor=16", "--seed=1",
                               "--total_env_steps=600000", "--target_mean_return=400", "--summary_interval_s=1")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target_reached"] and summary["mean_episode_return"] >= 400, output
    assert "env steps" in output and f"mean return of the last 100 {summary['mean_episode_return']:.1f}" in output

    # The commands printed next work as printed, from where the run was started.
    lines = dict(line.split(": ", 1) for line in output.splitlines() if line.startswith(("TensorBoard:", "Watch")))
    tensorboard, logdir_flag = lines["TensorBoard"].split(" --logdir ")
    assert (repo_root / tensorboard).exists() and logdir_flag == str(tmp_path)
    watch = shlex.split(lines["Watch the trained policy"]) + ["--episodes=2", "--record_episodes=1"]
    result = subprocess.run(watch, capture_output=True, text=True, timeout=300, cwd=repo_root)
    assert result.returncode == 0, result.stderr
    (gif,) = (tmp_path / "checkpoints").glob("ckpt-*-eval/episode_0000.gif")
    assert iio.imread(gif, index=None).shape[0] > 50  # a trained CartPole balances for a while

    scalars = local_run.read_scalars(tmp_path)
    for name in ["loss/total", "loss/policy", "loss/baseline", "policy/entropy", "value/explained_variance",
                 "optim/learning_rate", "optim/grad_norm", "throughput/env_steps_per_s",
                 "throughput/learner_steps_per_s", "inference/mean_batch_size", "inference/latency_ms",
                 "learner/unroll_queue_size", "learner/policy_lag_updates", "learner/connected_actors",
                 "episode/return", "episode/return_min", "episode/return_max", "episode/return_std",
                 "episode/length"]:
        assert scalars.get(name), f"no summary {name}; have {sorted(scalars)}"
        assert all(math.isfinite(v) for v in scalars[name]), name
    assert max(scalars["learner/connected_actors"]) == 2
    assert max(scalars["episode/return"]) > 100
    assert 1 <= max(scalars["inference/mean_batch_size"]) <= 32


@pytest.mark.slow
def test_ppo_solves_cartpole_within_500k_env_steps(tmp_path, local_run):
    local_run.train_to_target(tmp_path, "--problem=cartpole", "--hparams=algorithm=ppo", "--seed=1", "--batch_size=32",
                    "--unroll_length=16", "--block_inference_on_training", "--total_env_steps=500000",
                    "--target_mean_return=475", "--summary_interval_s=1")
    scalars = local_run.read_scalars(tmp_path)
    for name in ["ppo/approx_kl", "ppo/clip_fraction", "value/explained_variance", "loss/value",
                 "learner/policy_lag_updates"]:
        assert scalars.get(name) and all(math.isfinite(v) for v in scalars[name]), name
    assert max(scalars["value/explained_variance"]) > 0.5


@pytest.mark.slow
def test_a_gaussian_policy_learns_pendulum(tmp_path, local_run):
    """Continuous actions with PPO; a random policy averages about -1,250."""
    local_run.train_to_target(tmp_path, "--problem=pendulum", "--seed=1", "--envs_per_actor=16", "--batch_size=32",
                    "--unroll_length=32", "--block_inference_on_training", "--total_env_steps=300000",
                    "--target_mean_return=-700")


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    # Returns count actions, not chunks; random play averages about 22 on CartPole, -1,250 on Pendulum.
    ("--problem=cartpole", "--hparams=algorithm=ppo,chunk_size=2,reward_type=action_level,logprob_type=action_level",
     "--unroll_length=16", "--target_mean_return=400"),
    ("--problem=pendulum", "--hparams=chunk_size=2,reward_type=action_level,logprob_type=token_level",
     "--unroll_length=32", "--target_mean_return=-700"),
], ids=["cartpole", "pendulum"])
def test_ppo_learns_with_action_chunks(tmp_path, flags, local_run):
    # CartPole's run needed 67k-159k env steps to reach its target in eight runs, alone or beside busy
    # processes: the actors' interleaving makes each run its own. The budget is 2.5x the most seen.
    local_run.train_to_target(tmp_path, *flags, "--seed=1", "--envs_per_actor=16", "--batch_size=32",
                              "--block_inference_on_training", "--total_env_steps=400000")


@pytest.mark.slow
def test_mixing_teacher_forcing_into_rl_beats_pure_rl_at_equal_env_steps(tmp_path, local_run):
    """Grid navigation with a sparse reward: success of the policy's own (not forced) episodes."""
    success = {}
    for fraction in ("0.5", "0.0"):
        logdir = tmp_path / fraction
        process, tag = local_run.start(logdir, "--problem=grid_nav", f"--hparams=teacher_forcing_fraction={fraction}",
                                   "--seed=1", "--envs_per_actor=16", "--total_env_steps=40000",
                                   "--summary_interval_s=1")
        code, output = local_run.finish(process, tag)
        assert code == 0, output
        success[fraction] = json.loads((logdir / "summary.json").read_text())["mean_episode_return"]
        if fraction == "0.5":
            # Forced episodes follow the oracle.
            assert local_run.read_scalars(logdir)["episode_teacher/success"][-1] == 1.0
    assert success["0.5"] >= 0.6 and success["0.5"] > success["0.0"] + 0.3, success


@pytest.mark.slow
def test_grpo_learns_cartpole_without_a_value_function(tmp_path, local_run):
    local_run.train_to_target(tmp_path, "--problem=cartpole", "--hparams=algorithm=grpo,group_size=8", "--seed=1",
                    "--total_env_steps=400000", "--target_mean_return=200")


CUE_PROBLEM = '''
"""Remember a cue: shown at the first step only, then asked at every step after it."""
import dataclasses

import gymnasium as gym
import numpy as np

from fleetrl.agents import LSTMAgent, MLPAgent
from fleetrl.problems import Problem, ProblemConfig


class CueEnv(gym.Env):
    """The first observation is the cue (+1 or -1), the rest are 0. Each step pays 1 when the
    action names the cue's side. Episodes last longer than an unroll, so the cue reaches their
    later steps only through the recurrent state the learner kept between unrolls."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length):
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = self.np_random.choice([-1.0, 1.0]), 0
        return np.array([self.cue], np.float32), {}

    def step(self, action):
        reward = float(int(action) == int(self.cue > 0))
        self.t += 1
        return np.zeros(1, np.float32), reward, self.t >= self.length, False, {}


@dataclasses.dataclass
class CueConfig(ProblemConfig):
    length: int = 12
    recurrent: bool = True


class CueProblem(Problem):
    name = "cue"
    Config = CueConfig

    def make_env(self):
        return CueEnv(self.config.length)

    def make_agent(self):
        return LSTMAgent(1, 2, (32,), 32) if self.config.recurrent else MLPAgent(1, 2, (32,))
'''


@pytest.mark.slow
def test_the_recurrent_agent_learns_through_the_learner_side_state(tmp_path, local_run):
    """Episodes of 12 steps in unrolls of 5: a policy without memory earns at most 1 + 11/2 =
    6.5 a episode (the cue's own step, then chance), one that carries the cue across
    unrolls 12."""
    package = tmp_path / "user_code"
    package.mkdir()
    (package / "cue_problem.py").write_text(CUE_PROBLEM)
    local_run.train_to_target(tmp_path / "run", "--problem=cue_problem:CueProblem", "--num_actors=2",
                              "--envs_per_actor=16", "--unroll_length=5", "--seed=1", "--total_env_steps=300000",
                              "--target_mean_return=10", pythonpath=package, cwd=tmp_path)


USER_PROBLEM = '''
"""A user's Problem, outside fleetrl: say which side of zero the observation is on."""
import dataclasses

import gymnasium as gym
import numpy as np

from fleetrl.agents import MLPAgent
from fleetrl.problems import Problem, ProblemConfig


class SignEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, crash_after=0):
        self.crash_after, self.steps_taken = crash_after, 0

    def _observe(self):
        self.x = self.np_random.choice([-1.0, 1.0])
        return np.array([self.x], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.correct = 0, 0
        return self._observe(), {}

    def step(self, action):
        self.steps_taken += 1
        if self.crash_after and self.steps_taken > self.crash_after:
            raise RuntimeError("the simulator crashed")
        right = int(action) == int(self.x > 0)
        self.t, self.correct = self.t + 1, self.correct + right
        return self._observe(), float(right), self.t >= 10, False, {"correct": self.correct}


@dataclasses.dataclass
class SignConfig(ProblemConfig):
    crash_after: int = 0


class SignProblem(Problem):
    name = "sign"
    Config = SignConfig

    def make_env(self):
        return SignEnv(self.config.crash_after)

    def make_agent(self):
        return MLPAgent(1, 2, (16,))

    def episode_metrics(self, final_info):
        return {"accuracy": final_info["correct"] / 10}
'''


@pytest.fixture
def user_package(tmp_path):
    package = tmp_path / "user_code"
    (package / "my_pkg").mkdir(parents=True)
    (package / "my_pkg" / "__init__.py").write_text("")
    (package / "my_pkg" / "sign.py").write_text(textwrap.dedent(USER_PROBLEM))
    return package


@pytest.mark.slow
def test_a_user_problem_trains_by_import_path(tmp_path, user_package, local_run):
    logdir = tmp_path / "run"
    process, tag = local_run.start(logdir, "--problem=my_pkg.sign:SignProblem", "--num_actors=2", "--envs_per_actor=8",
                               "--total_env_steps=60000", "--target_mean_return=9.5", "--unroll_length=10",
                               "--summary_interval_s=1", pythonpath=user_package, cwd=tmp_path)
    code, output = local_run.finish(process, tag, timeout=300)
    assert code == 0, output
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["target_reached"], output  # random play scores 5 of 10
    accuracy = local_run.read_scalars(logdir)["episode/accuracy"]  # the Problem's own metric reaches TensorBoard
    assert accuracy and max(accuracy) > 0.9


def test_a_crashing_actor_stops_the_run_and_leaves_no_process(tmp_path, user_package, local_run):
    logdir = tmp_path / "run"
    process, tag = local_run.start(logdir, "--problem=my_pkg.sign:SignProblem", "--hparams=crash_after=300",
                               "--num_actors=2", "--envs_per_actor=4", pythonpath=user_package, cwd=tmp_path)
    code, output = local_run.finish(process, tag, timeout=300)
    assert code == 1
    assert "actor-" in output and "exited with code" in output and "the simulator crashed" in output


def test_ctrl_c_stops_everything_cleanly(tmp_path, local_run):
    process, tag = local_run.start(tmp_path, "--problem=cartpole", "--num_actors=2", "--envs_per_actor=4")
    deadline = time.monotonic() + 120
    while not (tmp_path / "learner_address").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    # Until both actors are connected and the learner has served steps (on a loaded machine
    # that takes longer than any fixed wait).
    with grpc.insecure_channel((tmp_path / "learner_address").read_text().strip()) as channel:
        stub = pb_grpc.LearnerStub(channel)
        while time.monotonic() < deadline:
            status = stub.GetStatus(pb.StatusRequest(), wait_for_ready=True, timeout=10)
            if status.connected_actors == 2 and status.env_steps > 0:
                break
            time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    code, output = local_run.finish(process, tag, timeout=120)
    assert code == 0, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reason"] == "stopped by SIGTERM" and summary["env_steps"] > 0, output


PPO_CARTPOLE = ("--problem=cartpole", "--block_inference_on_training", "--batch_size=32", "--unroll_length=16",
                "--seed=0", "--summary_interval_s=1")


@pytest.mark.slow
def test_eval_actors_write_eval_summaries_and_the_best_checkpoint_evaluates_alike(tmp_path, local_run):
    process, tag = local_run.start(tmp_path, *PPO_CARTPOLE, "--hparams=algorithm=ppo,eval_episodes=10",
                               "--num_eval_actors=1", "--eval_envs_per_actor=5", "--eval_interval_s=3",
                               "--total_env_steps=100000")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    rounds = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert len(rounds) >= 3 and all(r["episodes"] == 10 for r in rounds)
    assert "eval return" in output  # the progress line shows eval results

    events = EventAccumulator(str(tmp_path / "eval"), size_guidance={"scalars": 0})
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("eval/return")}
    assert logged == {r["policy_version"]: pytest.approx(r["return"]) for r in rounds}
    assert "eval/return" not in local_run.read_scalars(tmp_path)  # eval stays out of the training curves

    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["eval_metrics"]["return"] == max(r["return"] for r in rounds)
    assert best["eval_metrics"]["return"] > 100  # it learned
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.evaluate",
                             f"--checkpoint={tmp_path / 'checkpoints' / 'best.pt'}",
                             f"--output={tmp_path / 'standalone'}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    standalone = json.loads((tmp_path / "standalone" / "metrics.json").read_text())
    assert standalone["episodes"] == 10 and standalone["policy_version"] == best["policy_version"]
    # The same greedy policy on the same episodes.
    assert standalone["metrics"]["return"] >= 0.95 * best["eval_metrics"]["return"]


@pytest.mark.slow
def test_a_restarted_run_continues_its_counters_and_curves_and_keeps_improving(tmp_path, local_run):
    first = train_for(local_run, tmp_path, *PPO_CARTPOLE, "--hparams=algorithm=ppo", "--total_env_steps=30000")
    second = train_for(local_run, tmp_path, *PPO_CARTPOLE, "--hparams=algorithm=ppo", "--total_env_steps=150000")
    assert first["env_steps"] >= 30000 and second["env_steps"] >= 150000
    assert second["trainer_steps"] > first["trainer_steps"]
    assert "resumed from" in (tmp_path / "logs" / "learner.log").read_text()

    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()  # applies TensorBoard's purge of what the first run wrote after its checkpoint
    returns = [(e.step, e.value) for e in events.Scalars("episode/return")]
    before = max(v for step, v in returns if step <= first["env_steps"])
    after = max(v for step, v in returns if step > first["env_steps"])
    assert after > before + 100, (before, after)  # training went on improving
    versions = events.Scalars("learner/policy_version")
    steps = [e.step for e in versions]
    assert steps == sorted(set(steps)), "a TensorBoard step went backwards or repeated"
    assert min(steps) < first["env_steps"] <= max(steps)
    values = [e.value for e in versions]
    assert values == sorted(values)  # the policy version carried on from the checkpoint


def train_for(local_run, logdir, *flags) -> dict:
    process, tag = local_run.start(logdir, *flags)
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    return json.loads((pathlib.Path(logdir) / "summary.json").read_text())


@pytest.mark.slow
def test_tensorboard_shows_the_config_and_no_duplicate_idle_or_sparse_curves(tmp_path, local_run):
    """A short CartPole run, read back from its event files: what a researcher opens first."""
    process, tag = local_run.start(tmp_path, "--problem=cartpole", "--num_actors=1", "--envs_per_actor=8",
                                   "--total_env_steps=25000")
    code, output = local_run.finish(process, tag, timeout=300)
    assert code == 0, output
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    # The whole config, in the Text tab and in config.json.
    (text,) = [tag for tag in events.Tags()["tensors"] if tag.startswith("config")]
    config = json.loads((tmp_path / "config.json").read_text())
    assert set(config) == {"launch", "learner", "problem"} and config["launch"]["num_actors"] == 1
    assert b'"batch_size": 8' in events.Tensors(text)[0].tensor_proto.string_val[0]
    series = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    # Episode curves, with their spread, sort first in TensorBoard (its groups go by name).
    assert {"episode/return", "episode/return_min", "episode/return_max", "episode/return_std"} <= set(series)
    assert sorted({tag.split("/")[0] for tag in series})[0] == "episode"
    # No tag for an unused feature, no counter of nothing, no copy of another curve.
    assert not any(tag.startswith("teacher_forcing/") or tag == "loss/entropy" for tag in series)
    assert not any(all(v == 0 for v in values) for values in series.values()), \
        [tag for tag, values in series.items() if all(v == 0 for v in values)]
    curves = sorted(series.items())
    for i, (a, va) in enumerate(curves):
        for b, vb in curves[i + 1:]:
            if (a, b) == ("episode/length", "episode/return"):
                continue  # CartPole's return is its length: the env's doing, not a copy
            if len(va) == len(vb) and len(va) > 2:
                assert va != vb and va != [-v for v in vb], f"{a} duplicates {b}"
    # Enough points on a short run (about one a second), and no empty eval run without eval actors.
    wall_s = json.loads((tmp_path / "summary.json").read_text())["wall_s"]
    assert len(series["episode/return"]) >= min(20, wall_s / 2), (len(series["episode/return"]), wall_s)
    assert not (tmp_path / "eval").exists()
