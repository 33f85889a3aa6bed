"""launch.debug: the whole run in one process and one thread, deterministic, with
breakpoints anywhere; and launch.inspect, which reads what --record_unrolls wrote.

The user Problem is docs/examples/corridor.py, the worked example of docs/debugging.md
(its env never pays its reward), imported by path as a user's own package would be.
"""

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.launch import inspect
from fleetrl.launch.configs import DebugConfig, FleetConfig
from fleetrl.launch.debug_run import DebugRun
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.run.summaries import WALL_CLOCK

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "examples"

# A module of the user's: the docs' corridor, its env stopping at the first episode that reaches the end.
PAUSING = '''
from corridor import CorridorEnv, CorridorProblem

PAUSED = []


class PausingEnv(CorridorEnv):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if terminated and not PAUSED:
            PAUSED.append(self.steps)
            breakpoint()
        return observation, reward, terminated, truncated, info


class PausingCorridor(CorridorProblem):
    def make_env(self):
        return PausingEnv(self.config.length, self.config.max_episode_steps)
'''

FAILING = '''
from corridor import CorridorEnv, CorridorProblem


class FailingEnv(CorridorEnv):
    def step(self, action):
        cell = self.position * 10 + 7
        if self.steps == 3:
            raise ValueError(f"planted failure at cell {cell}")
        return super().step(action)


class FailingCorridor(CorridorProblem):
    def make_env(self):
        return FailingEnv(self.config.length, self.config.max_episode_steps)
'''


def debug(cwd, *flags: str, stdin: str | None = None, path=(), timeout_s: float = 300,
          cache: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """`python -m fleetrl.launch.debug` with `path` on PYTHONPATH, `stdin` typed into it,
    and `cache` as the tiny models' cache folder (FLEETRL_CACHE) if given."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONBREAKPOINT"}  # breakpoint() must reach pdb
    if cache is not None:
        env["FLEETRL_CACHE"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "fleetrl.launch.debug", "--noprogress", *flags], cwd=cwd, env=env,
                          input=stdin or "", capture_output=True, text=True, timeout=timeout_s)


def test_a_breakpoint_in_a_user_problems_env_stops_the_run_in_its_terminal(tmp_path):
    (tmp_path / "pausing.py").write_text(PAUSING)
    result = debug(tmp_path, "--problem=pausing:PausingCorridor", f"--logdir={tmp_path / 'run'}",
                   "--total_env_steps=3000", "--num_actors=1", "--envs_per_actor=4",
                   stdin="p ('seen', reward, self.position, self.steps)\nc\n", path=[tmp_path, EXAMPLES])
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "(Pdb)" in out and "pausing.py" in out, out  # pdb stopped in the user's file
    # The variables at the breakpoint: the episode that reached the end was paid nothing, at cell 0.
    seen = out[out.index("('seen', "):].splitlines()[0]
    assert seen.startswith("('seen', 0.0, 0, "), seen
    assert "done: total_env_steps reached" in out, out  # and, continued, the run went on to its end
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] >= 3000


def test_quitting_pdb_at_a_breakpoint_still_writes_the_runs_summary(tmp_path):
    (tmp_path / "pausing.py").write_text(PAUSING)
    result = debug(tmp_path, "--problem=pausing:PausingCorridor", f"--logdir={tmp_path / 'run'}",
                   "--total_env_steps=3000", "--num_actors=1", "--envs_per_actor=4", stdin="q\n",
                   path=[tmp_path, EXAMPLES])
    assert result.returncode == 1 and "quit from pdb" in result.stderr, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"] == "quit from the debugger" and summary["final_checkpoint"], summary


def test_post_mortem_opens_pdb_in_the_frame_that_raised(tmp_path):
    (tmp_path / "failing.py").write_text(FAILING)
    result = debug(tmp_path, "--problem=failing:FailingCorridor", f"--logdir={tmp_path / 'run'}", "--post_mortem",
                   "--num_actors=1", "--envs_per_actor=2", stdin="p ('cell is', cell)\nq\n",
                   path=[tmp_path, EXAMPLES])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ValueError: planted failure at cell" in result.stderr, result.stderr
    assert "post mortem" in result.stdout and "('cell is', " in result.stdout, result.stdout
    assert "(Pdb)" in result.stdout


def fingerprint(logdir: pathlib.Path) -> tuple[dict, dict, dict]:
    """(summary counters, final weights, every TensorBoard scalar that does not measure time)."""
    summary = json.loads((logdir / "summary.json").read_text())
    weights = torch.load(summary.pop("final_checkpoint"), weights_only=True)["model"]
    summary.pop("wall_s"), summary.pop("run_wall_s")
    scalars = {}
    for prefix, folder in (("", logdir), ("eval run: ", logdir / "eval")):  # eval rounds write to their own run
        if not folder.is_dir():
            continue
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        scalars.update({prefix + tag: [(e.step, e.value) for e in events.Scalars(tag)]
                        for tag in events.Tags()["scalars"] if tag not in WALL_CLOCK})
    return summary, weights, scalars


def assert_identical(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert a[2].keys() == b[2].keys()
    for tag in a[2]:
        assert a[2][tag] == b[2][tag], tag


def test_two_debug_runs_of_cartpole_are_bit_identical_and_another_seed_is_not(tmp_path):
    flags = ["--problem=cartpole", "--num_actors=2", "--envs_per_actor=8", "--total_env_steps=12000",
             "--summary_every_updates=5"]
    runs = {}
    for name, seed in (("a", 3), ("b", 3), ("other", 4)):
        result = debug(tmp_path, *flags, f"--seed={seed}", f"--logdir={tmp_path / name}")
        assert result.returncode == 0, result.stdout + result.stderr
        runs[name] = fingerprint(tmp_path / name)
    assert runs["a"][0]["trainer_steps"] >= 50 and len(runs["a"][2]["episode/return"]) >= 10
    assert_identical(runs["a"], runs["b"])
    assert not torch.equal(runs["a"][1]["policy.0.weight"] if "policy.0.weight" in runs["a"][1]
                           else next(iter(runs["a"][1].values())), next(iter(runs["other"][1].values())))
    assert runs["a"][2]["episode/return"] != runs["other"][2]["episode/return"]


def test_two_debug_runs_with_chunks_teacher_forcing_and_eval_rounds_are_bit_identical(tmp_path):
    """PointReach's flow VLA denoises chunks of 4 actions; half of its episodes are teacher-forced
    and an eval actor plays a round every 4 updates."""
    flags = ["--problem=point_reach", "--num_actors=2", "--envs_per_actor=2", "--total_env_steps=240",
             "--hparams=teacher_forcing_fraction=0.5,eval_episodes=4", "--batch_size=2", "--unroll_length=8",
             "--num_eval_actors=1", "--eval_envs_per_actor=2", "--eval_every_updates=4",
             "--summary_every_updates=2", "--seed=5"]
    runs = []
    for name in ("a", "b"):  # a builds the tiny model into an empty cache, b finds it there
        result = debug(tmp_path, *flags, f"--logdir={tmp_path / name}", cache=tmp_path / "cache")
        assert result.returncode == 0, result.stdout + result.stderr
        runs.append(fingerprint(tmp_path / name))
    scalars = runs[0][2]
    assert "loss/teacher_forcing" in scalars and "eval run: eval/return" in scalars, sorted(scalars)
    assert len(scalars["eval run: eval/return"]) >= 2
    assert_identical(*runs)


@pytest.mark.slow
def test_cartpole_learns_in_a_debug_run_within_the_make_run_budget(tmp_path):
    """`make run`'s flags (2 actors x 32 envs, 1M env steps, target 475), in one thread."""
    result = debug(tmp_path, "--problem=cartpole", "--num_actors=2", "--envs_per_actor=32",
                   "--total_env_steps=1000000", "--target_mean_return=475", "--summary_every_updates=100",
                   f"--logdir={tmp_path / 'run'}", timeout_s=900)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["target_reached"] and summary["env_steps"] <= 1_000_000, summary


def test_the_debug_run_drives_the_learner_without_transport_or_threads(tmp_path):
    threads = threading.active_count()
    learner = LearnerConfig(problem="cartpole", logdir=str(tmp_path), unroll_length=5, batch_size=4, seed=1)
    run = DebugRun(DebugConfig(learner, FleetConfig(num_actors=2, envs_per_actor=4, env_groups=2), progress=False))
    assert not hasattr(run.run, "server") and threading.active_count() == threads
    for _ in range(6):  # unroll_length + 1 steps: each env's first unroll is done
        run.step()
    assert run.run.unrolls.qsize() == 8  # 2 actors x 4 envs
    assert run.train() and run.updates == 2 and run.run.policy.version == 2
    summary = run.run_to_end(max_updates=5)
    assert summary.trainer_steps == 5 and summary.reason == "max_updates reached (5)"
    assert threading.active_count() == threads


def test_inspect_finds_the_docs_examples_bug_and_nothing_once_it_is_fixed(tmp_path):
    source = (EXAMPLES / "corridor.py").read_text()
    # docs/debugging.md's fix: the reward is computed before the episode's end moves the agent back.
    bug = ("        if terminated:\n            self.position = 0  # back to the start for the next episode\n"
           "        reward = 1.0 if self.position == self.length else 0.0\n")
    fix = ("        reward = 1.0 if self.position == self.length else 0.0\n"
           "        if terminated:\n            self.position = 0  # back to the start for the next episode\n")
    assert bug in source
    (tmp_path / "fixed").mkdir()
    (tmp_path / "fixed" / "corridor.py").write_text(source.replace(bug, fix))
    for name, folder in (("buggy", EXAMPLES), ("fixed", tmp_path / "fixed")):
        result = debug(tmp_path, "--problem=corridor:CorridorProblem", f"--logdir={tmp_path / name}",
                       "--total_env_steps=20000", "--record_unrolls=2", path=[folder])
        assert result.returncode == 0, result.stdout + result.stderr
    buggy = inspect.findings(inspect.read(str(tmp_path / "buggy" / "recorded_unrolls.npz")))
    assert len(buggy) == 1 and buggy[0].startswith("reward: all 312 rewards are 0"), buggy
    assert inspect.findings(inspect.read(str(tmp_path / "fixed" / "recorded_unrolls.npz"))) == []
    assert json.loads((tmp_path / "fixed" / "summary.json").read_text())["mean_episode_return"] > 0.5


@pytest.fixture(scope="module")
def clean_recording(tmp_path_factory) -> dict[str, np.ndarray]:
    """Three batches of a real CartPole debug run, which inspect finds nothing wrong with."""
    logdir = tmp_path_factory.mktemp("recorded")
    result = debug(logdir, "--problem=cartpole", "--num_actors=1", "--envs_per_actor=8", "--total_env_steps=3000",
                   "--record_unrolls=3", f"--logdir={logdir}")
    assert result.returncode == 0, result.stdout + result.stderr
    arrays = inspect.read(str(logdir / "recorded_unrolls.npz"))
    assert arrays["reward"].shape == (3, 21, 8) and arrays["loss/advantages"].shape == (3, 20, 8)
    assert inspect.findings(arrays) == []
    return arrays


def plant(arrays, **changes):
    return {**arrays, **changes}


@pytest.mark.parametrize("mistake, flagged", [
    ("constant rewards", "reward: all 476 rewards are 0:"),
    ("frozen observations", "observation/observation: never changes"),
    ("no dones", "terminated, truncated: no episode ended"),
    ("actions outside the space", "action/action: 5 of "),
    ("log-probs of -inf", "behaviour_log_prob: 2 are -inf"),
    ("NaN advantages", "loss/advantages: 1 NaNs"),
])
def test_inspect_flags_each_planted_mistake(clean_recording, mistake, flagged):
    a = clean_recording
    planted = {
        "constant rewards": lambda: plant(a, reward=np.zeros_like(a["reward"])),
        "frozen observations": lambda: plant(a, **{"observation/observation": np.broadcast_to(
            a["observation/observation"][:, :1], a["observation/observation"].shape)}),
        "no dones": lambda: plant(a, terminated=np.zeros_like(a["terminated"]),
                                  truncated=np.zeros_like(a["truncated"])),
        "actions outside the space": lambda: plant(a, **{"action/action": np.where(
            np.arange(a["action/action"].size).reshape(a["action/action"].shape) < 5, 2, a["action/action"])}),
        "log-probs of -inf": lambda: plant(a, behaviour_log_prob=np.where(
            np.arange(a["behaviour_log_prob"].size).reshape(a["behaviour_log_prob"].shape) < 2, -np.inf,
            a["behaviour_log_prob"])),
        "NaN advantages": lambda: plant(a, **{"loss/advantages": np.where(
            np.arange(a["loss/advantages"].size).reshape(a["loss/advantages"].shape) == 7, np.nan,
            a["loss/advantages"])}),
    }[mistake]()
    found = inspect.findings(planted)
    assert len(found) == 1 and found[0].startswith(flagged), found


def test_inspect_prints_every_field_and_exits_1_when_it_flags_something(clean_recording, tmp_path):
    path = tmp_path / "planted.npz"
    np.savez(path, **plant(clean_recording, reward=np.zeros_like(clean_recording["reward"])))
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.inspect", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    for field in ("observation/observation", "action/action", "reward", "behaviour_log_prob", "loss/advantages",
                  "loss/returns"):
        assert f"\n{field} " in result.stdout, field
    assert "histogram 0: " in result.stdout and "1 thing(s) to look at" in result.stdout
    missing = subprocess.run([sys.executable, "-m", "fleetrl.launch.inspect", str(tmp_path / "none.npz")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "--record_unrolls" in missing.stderr
