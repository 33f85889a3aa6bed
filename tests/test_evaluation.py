"""Evaluation: eval rounds handed to eval actors, and standalone evaluation with recordings."""

import json
import os
import subprocess
import sys
import textwrap

import imageio.v3 as iio
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.launch.progress import EpisodeProgress
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.evaluation.eval_rounds import EvalRounds


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def rounds_of(episodes=5, interval_s=10.0):
    versions = iter(range(100, 1000, 100))
    clock = Clock()
    rounds = EvalRounds(lambda: (torch.nn.Linear(1, 1), next(versions)), episodes, interval_s, clock=clock)
    return rounds, clock


def test_a_round_hands_out_the_eval_set_once_and_averages_it_at_one_version():
    rounds, clock = rounds_of()
    a, b = rounds.work("a", 2), rounds.work("b", 2)
    assert (a.episodes, b.episodes) == ([0, 1], [2, 3]) and a.policy_version == b.policy_version == 100
    assert rounds.agent_for("a")[0] is rounds.agent_for("b")[0]  # one frozen snapshot per round
    done = [rounds.record("a", episode, {"return": float(episode)}) for episode in a.episodes]
    c = rounds.work("a", 2)  # fast actors take more
    assert c.episodes == [4] and c.round == 0
    done.append(rounds.record("a", 4, {"return": 4.0}))
    done += [rounds.record("b", episode, {"return": float(episode), "success": 1.0}) for episode in b.episodes]
    assert done[:-1] == [None] * 4  # only the round's last episode completes it
    result = done[-1]
    assert result.policy_version == 100 and result.metrics == {"return": 2.0, "success": 1.0}
    # The next round waits for the interval, then runs at the newer version.
    assert rounds.work("a", 2).retry_after_s > 0
    clock.now = 10.0
    assert rounds.work("a", 2).policy_version == 200


def test_episodes_of_a_vanished_actor_go_to_the_others():
    rounds, _ = rounds_of(episodes=3)
    assert rounds.work("a", 2).episodes == [0, 1]
    rounds.disconnect("a")
    assert rounds.work("b", 3).episodes == [0, 1, 2]
    with pytest.raises(ValueError, match="eval episode 1 was not assigned to actor 'a'"):
        rounds.record("a", 1, {"return": 1.0})


def checkpoint_of_an_untrained(tmp_path, problem, **hparams):
    from fleetrl.learner.learner import Learner

    learner = Learner(LearnerConfig(problem=problem, bind="127.0.0.1:0", logdir=str(tmp_path / "run"),
                                    hparams=hparams))
    path = learner.run_state.save()
    learner.server.stop(0)
    return path


@pytest.mark.parametrize("video_format", ["gif", "mp4"])
def test_standalone_evaluation_records_image_episodes(tmp_path, video_format):
    checkpoint = checkpoint_of_an_untrained(tmp_path, "grid_nav", max_steps="12")
    out = tmp_path / "eval"
    result = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={checkpoint}", "--episodes=5",
         "--num_envs=2", "--record", "--record_episodes=3", f"--record_format={video_format}", f"--output={out}"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "return" in result.stdout and "success" in result.stdout  # the table
    report = json.loads((out / "metrics.json").read_text())
    assert report["episodes"] == 5 and len(report["per_episode"]) == 5
    # Progress as episodes finish, the last line over all of them, before the table.
    progress = [line for line in result.stdout.splitlines() if line.startswith("episodes ")]
    mean_return = sum(e["return"] for e in report["per_episode"]) / 5
    assert progress and progress[-1].startswith(f"episodes 5/5 | return {mean_return:.3g} |"), result.stdout
    lengths = [episode["length"] for episode in report["per_episode"]]
    for episode in range(3):
        path = out / f"episode_{episode:04d}.{video_format}"
        if video_format == "mp4":
            # An MP4 container (decoding it needs an ffmpeg subprocess: too slow for a loaded CI box).
            data = path.read_bytes()
            assert data[4:8] == b"ftyp" and len(data) > 1000
            continue
        frames = iio.imread(path, index=None)
        # The reset frame plus one per step, though GIF merges identical consecutive frames
        # into a longer one; 9x9 cells of 8 pixels.
        assert 2 <= frames.shape[0] <= lengths[episode] + 1 and frames.shape[1:3] == (72, 72)
    assert not (out / f"episode_0003.{video_format}").exists()
    events = EventAccumulator(str(out), size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["eval/episode_0000", "eval/episode_0001", "eval/episode_0002"]
    assert events.Images("eval/episode_0000")[0].encoded_image_string[:6] == b"GIF89a"


NO_PICTURES = textwrap.dedent("""
    import gymnasium as gym
    import numpy as np
    from fleetrl.agents import MLPAgent
    from fleetrl.problems import Problem

    class Blind(gym.Env):  # no image observation, no render
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, True, False, {}

    class BlindProblem(Problem):
        def make_env(self):
            return Blind()

        def make_agent(self):
            return MLPAgent(2, 2, (8,))
""")


def test_recording_a_problem_with_nothing_to_draw_fails_at_once_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "blind.py").write_text(NO_PICTURES)
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = checkpoint_of_an_untrained(tmp_path, "blind:BlindProblem")
    result = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={checkpoint}", "--problem=blind:BlindProblem",
         "--episodes=1", "--record",
         f"--output={tmp_path / 'eval'}"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--record: BlindProblem has nothing to record" in result.stderr
    assert "render_mode='rgb_array'" in result.stderr and not (tmp_path / "eval").exists()


RENDERING_CARTPOLE = textwrap.dedent("""
    from fleetrl.problems.cartpole import CartPoleProblem

    class BigFrames(CartPoleProblem):  # a subclass that only changes how episodes are drawn
        def render_frame(self, observation, env=None):
            frame = super().render_frame(observation, env)
            return frame.repeat(2, axis=0).repeat(2, axis=1)
""")


def test_a_run_is_evaluated_from_its_logdir_and_a_subclass_may_draw_it(tmp_path, monkeypatch):
    """CartPole records its own renders; a run's logdir names its latest checkpoint; a
    subclass of the checkpoint's Problem, given explicitly, plays its weights."""
    checkpoint = checkpoint_of_an_untrained(tmp_path, "cartpole", max_episode_steps="15")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={run_dir}", "--episodes=2", "--record",
         "--record_episodes=1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"evaluating {checkpoint}" in result.stdout
    frames = iio.imread(f"{checkpoint[:-3]}-eval/episode_0000.gif", index=None)
    assert frames.shape[1:] == (400, 600, 3) and frames.shape[0] >= 2  # gymnasium's own CartPole drawing

    (tmp_path / "big_frames.py").write_text(RENDERING_CARTPOLE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={checkpoint}",
         "--problem=big_frames:BigFrames", "--episodes=1", "--record", f"--output={tmp_path / 'big'}"],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert iio.imread(tmp_path / "big" / "episode_0000.gif", index=None).shape[1:] == (800, 1200, 3)
    # A Problem that is neither the checkpoint's nor its subclass needs asking twice.
    result = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={checkpoint}", "--problem=grid_nav",
         "--hparams=", "--episodes=1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "was written by problem 'cartpole', not 'grid_nav'" in result.stderr
    assert "--allow_other_problem plays its weights where they fit" in result.stderr  # the flag that asks twice


def test_standalone_evaluation_sets_hparams_over_the_checkpoints_own(tmp_path):
    """--hparams changes what it names and keeps the rest of the run's config (a VLM run's
    --greedy_eval=false, say, over its model settings)."""
    checkpoint = checkpoint_of_an_untrained(tmp_path, "cartpole", discount="0.9", max_episode_steps="40")
    result = subprocess.run(
        [sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={checkpoint}", "--episodes=2",
         "--hparams=max_episode_steps=5", f"--output={tmp_path / 'eval'}"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert report["hparams"]["discount"] == "0.9" and report["hparams"]["max_episode_steps"] == "5"
    assert max(episode["length"] for episode in report["per_episode"]) <= 5


def test_evaluation_progress_prints_as_episodes_finish_at_most_every_interval(capsys):
    now = [0.0]
    progress = EpisodeProgress(total=4, interval_s=2.0, clock=lambda: now[0])
    progress({0: {"return": 1.0, "success": 1.0}})
    now[0] = 1.0
    progress({0: {"return": 1.0, "success": 1.0}, 1: {"return": 0.0, "success": 0.0}})  # within 2 s: held
    now[0] = 1.5
    progress({e: {"return": float(e), "success": 0.0} for e in range(4)})  # the last: always
    assert capsys.readouterr().out.splitlines() == ["episodes 1/4 | return 1 | success 1",
                                                    "episodes 4/4 | return 1.5 | success 0"]


def test_eval_inference_plays_the_problems_own_agent_step_with_no_extras_and_the_mode():
    """Eval's forward pass is training's (`policy_step` in learner/inference/inference_step.py):
    the Problem's own agent_step runs, the step's extras hidden from it and from the action
    choice (no oracle plays an eval episode), and the action is the policy's mode."""
    import numpy as np

    from fleetrl.learner.evaluation.eval_inference import EvalInference, EvalRequest
    from fleetrl.learner.inference.env_state_store import build_state_store
    from fleetrl.learner.inference.inference_step import StepRequest
    from fleetrl.problems.cartpole import CartPoleProblem

    seen = []

    class Watched(CartPoleProblem):
        def agent_step(self, agent, observation, first, state, extras):
            seen.append(dict(extras))
            return super().agent_step(agent, observation, first, state, extras)

    problem = Watched.from_hparams({})
    agent = problem.make_agent()
    store = build_state_store(problem, agent, 4, torch.device("cpu"), record=False)
    inference = EvalInference(problem, store, torch.device("cpu"))
    slots, run_ids = store.allocate(6), np.arange(1, 7, dtype=np.uint64)
    observation = {"observation": np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)}
    request = StepRequest(slots=slots, run_ids=run_ids, observation=observation,
                          extras={"teacher_forcing": np.ones(6, bool)}, reward=np.zeros(6, np.float32),
                          terminated=np.zeros(6, bool), truncated=np.zeros(6, bool))
    [reply] = inference([EvalRequest(step=request, agent=agent)])
    assert seen == [{}]
    with torch.no_grad():
        logits = agent.head(agent.torso({"observation": torch.from_numpy(observation["observation"])}))
    np.testing.assert_array_equal(reply["action"], logits["policy_logits"].argmax(-1).numpy())


def test_eval_record_hooks_are_taken_from_a_problem_with_or_without_the_eval_records_class():
    """EvalRecords is optional: a Problem that inherits it, or one that only defines a hook
    of it, gets its own; every other hook keeps the default."""
    import numpy as np

    from fleetrl.problems.cartpole import CartPoleProblem
    from fleetrl.problems.eval_records import EvalRecords, eval_records

    picture = {"first": np.zeros((2, 2, 3), np.uint8)}

    class Drawn(CartPoleProblem):
        def eval_images(self, final_info):
            return picture

    class Recorded(CartPoleProblem, EvalRecords):
        def learner_writes_eval_records(self):
            return True

    drawn, recorded, plain = (eval_records(cls.from_hparams({})) for cls in (Drawn, Recorded, CartPoleProblem))
    assert drawn.eval_images({}) is picture and not drawn.learner_writes_eval_records()
    assert recorded.learner_writes_eval_records() and recorded.eval_images({}) == {}
    assert plain.eval_images({}) == {} and plain.eval_metric_names() == () and plain.episode_record({}) is None
    assert not hasattr(CartPoleProblem.from_hparams({}), "eval_images")  # not on a Problem that does not ask


def test_evaluation_without_a_checkpoint_says_what_it_plays(tmp_path):
    """No checkpoint: an agent with no model_path is randomly initialised, and says so
    (it used to be announced as "the pretrained weights its hparams name")."""
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.evaluate", "--problem=cartpole", "--episodes=2",
                             "--num_envs=2", f"--output={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "evaluating a randomly initialised agent (no checkpoint, no model_path)" in result.stdout


def test_a_loaded_pi0_folder_is_reported_in_one_line(tmp_path, caplog):
    """Which model, how large, whose tokenizer, and whether normalization statistics were
    found and applied."""
    import logging

    from fleetrl.agents.pi0.flow_vla_agent import load_base
    from fleetrl.agents.pi0.tiny import TinyPi0Config, build_tiny_pi0
    from fleetrl.learner.run.saved_policy import pretrained_policy

    folder = build_tiny_pi0(["pick up the red block"], TinyPi0Config(pi05=True, action_dim=8, action_horizon=4),
                            root=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="fleetrl.agents.pi0.flow_vla_agent"):
        load_base(folder)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")]
    assert line.startswith(f"loaded pi0.5 from {folder}: ") and "M parameters (float32)" in line
    assert f"tokenizer from {folder}" in line and "normalization: " in line
    policy = pretrained_policy("point_reach", {"model_path": "tiny"})
    assert policy.source().startswith("a tiny randomly initialised model (model_path=tiny")
