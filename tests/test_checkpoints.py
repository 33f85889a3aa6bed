"""Checkpoints: atomic saves that survive SIGKILL, exact resume, warm start, export, clear errors."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from fleetrl.common.files import strict_json
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.learner.run.checkpoint import (
    CheckpointDir,
    CheckpointError,
    export_weights,
    load_checkpoint,
    load_fitting_weights,
)
from fleetrl.learner.run.run_files import write_summary
from fleetrl.problems import load_problem


def learner_on(logdir, **overrides) -> Learner:
    return Learner(LearnerConfig(bind="127.0.0.1:0", logdir=str(logdir), **overrides))


def train_a_little(learner: Learner, unroll_batch) -> None:
    """A few real optimizer steps, so the optimizer has state and the counters move."""
    for _ in range(3):
        learner.scalars.add_all(learner.trainer.update(unroll_batch(learner.problem, learner.agent)))
    learner.inference.env_steps += 1234
    learner.episodes.total += 7


def test_a_restarted_learner_resumes_weights_optimizer_counters_and_rng(tmp_path, unroll_batch):
    first = learner_on(tmp_path)
    train_a_little(first, unroll_batch)
    first.run_state.save()
    saved_optimizer = first.optimizer.state_dict()
    first.server.stop(0)

    second = learner_on(tmp_path)
    assert second.resumed_from is not None and second.resumed_from.endswith("ckpt-0000000003.pt")
    assert second.policy.version == 3
    assert (second.inference.env_steps, second.episodes.total) == (first.inference.env_steps, 7)
    for name, value in first.agent.state_dict().items():
        assert torch.equal(second.agent.state_dict()[name], value), name
    restored = second.optimizer.state_dict()
    assert restored["state"].keys() == saved_optimizer["state"].keys()
    for key, state in saved_optimizer["state"].items():
        assert torch.equal(restored["state"][key]["exp_avg"], state["exp_avg"])
        assert torch.equal(restored["state"][key]["exp_avg_sq"], state["exp_avg_sq"])
    assert torch.equal(second.trainer.shuffle_generator.get_state(), first.trainer.shuffle_generator.get_state())
    second.server.stop(0)


def strict_load(path):
    """JSON as a strict parser reads it: a bare NaN or Infinity is an error."""
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which is not JSON")
    return json.loads(pathlib.Path(path).read_text(), parse_constant=refuse)


def test_a_resumed_run_reports_the_return_window_it_had_and_writes_strict_json(tmp_path):
    first = learner_on(tmp_path)
    first.episodes.extend([{"return": 10.0}, {"return": 20.0}])
    first.run_state.earlier_wall_s = 1000.0  # as if it had trained for a while
    first.run_state.save()
    first.server.stop(0)

    second = learner_on(tmp_path)  # resumed, and stopped before any episode ended
    write_summary(str(tmp_path), second.summary())
    second.server.stop(0)
    summary = strict_load(tmp_path / "summary.json")
    assert (summary["episodes"], summary["mean_episode_return"], summary["returns_in_window"]) == (2, 15.0, 2)
    # wall_s is this process's; run_wall_s the run's, the first process's time included.
    assert summary["wall_s"] < 100 and 1000 <= summary["run_wall_s"] <= 1000 + summary["wall_s"] + 1

    fresh = learner_on(tmp_path / "fresh")  # no episode at all: the mean is null, and the count says why
    write_summary(str(tmp_path / "fresh"), fresh.summary())
    fresh.server.stop(0)
    summary = strict_load(tmp_path / "fresh" / "summary.json")
    assert (summary["episodes"], summary["mean_episode_return"], summary["returns_in_window"]) == (0, None, 0)


def test_strict_json_writes_null_for_nan_and_infinity_at_any_depth():
    data = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (2.5, float("nan")), "e": "NaN"}
    assert json.loads(strict_json(data)) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2.5, None],
                                              "e": "NaN"}


def test_checkpoints_load_without_pickled_code_and_only_the_last_k_are_kept(tmp_path, unroll_batch):
    learner = learner_on(tmp_path, keep_checkpoints=2)
    for _ in range(4):
        train_a_little(learner, unroll_batch)
        learner.run_state.save()
    learner.server.stop(0)
    paths = CheckpointDir(str(tmp_path / "checkpoints")).periodic()
    assert [os.path.basename(p) for p in paths] == ["ckpt-0000000009.pt", "ckpt-0000000012.pt"]
    checkpoint = torch.load(paths[-1], weights_only=True)
    assert checkpoint["problem"] == "cartpole" and checkpoint["policy_version"] == 12
    assert checkpoint["learner_config"]["keep_checkpoints"] == 2 and "optimizer" in checkpoint


def test_warm_start_and_export_round_trip(tmp_path, unroll_batch):
    source = learner_on(tmp_path / "a")
    train_a_little(source, unroll_batch)
    path = source.run_state.save()
    source.server.stop(0)

    warm = learner_on(tmp_path / "b", init_checkpoint=path)
    assert warm.resumed_from is None and warm.policy.version == 0 and warm.inference.env_steps == 0
    observation = {"observation": torch.randn(5, 4)}
    first = torch.ones(5, dtype=torch.bool)
    with torch.no_grad():
        want, _ = source.agent.step(observation, first, source.agent.initial_state(observation))
        got, _ = warm.agent.step(observation, first, warm.agent.initial_state(observation))
    torch.testing.assert_close(got, want)
    warm.server.stop(0)

    exported = tmp_path / "model.pt"
    export_weights(path, str(exported))
    weights = torch.load(exported, weights_only=True)
    agent = load_problem(weights["problem"], weights["hparams"]).make_agent()
    agent.load_state_dict(weights["model"])
    with torch.no_grad():
        again, _ = agent.step(observation, first, agent.initial_state(observation))
    torch.testing.assert_close(again, want)


def test_checkpoints_that_do_not_fit_are_refused_by_name(tmp_path):
    learner = learner_on(tmp_path / "run")
    path = learner.run_state.save()
    learner.server.stop(0)
    with pytest.raises(CheckpointError, match="written by problem 'cartpole', not 'grid_nav'"):
        learner_on(tmp_path / "other", problem="grid_nav", init_checkpoint=path)
    with pytest.raises(CheckpointError, match=r"body\.0\.weight has shape \[64, 4\] in the checkpoint and \[32, 4\]"):
        learner_on(tmp_path / "narrow", hparams={"hidden_sizes": "[32,32]"}, init_checkpoint=path)
    with pytest.raises(CheckpointError, match="no checkpoint file at"):
        learner_on(tmp_path / "missing", init_checkpoint=str(tmp_path / "nope.pt"))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="is not a readable fleetrl checkpoint"):
        load_checkpoint(str(garbage))


USER_PROBLEMS = textwrap.dedent("""
    import gymnasium as gym

    from fleetrl.agents import MLPAgent
    from fleetrl.problems.base import Problem


    class Balance(Problem):  # a user's own CartPole, under another name
        def make_env(self):
            return gym.make("CartPole-v1")

        def make_agent(self):
            return MLPAgent(4, 2, (64, 64), shared_torso=True)


    class NarrowBalance(Balance):
        def make_agent(self):
            return MLPAgent(4, 2, (32, 32), shared_torso=True)
""")


def test_another_problems_weights_are_taken_by_choice_where_names_and_shapes_fit(tmp_path, unroll_batch,
                                                                                  monkeypatch, caplog):
    (tmp_path / "balance.py").write_text(USER_PROBLEMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = learner_on(tmp_path / "a", hparams={"shared_torso": "true"})
    train_a_little(source, unroll_batch)
    path = source.run_state.save()
    source.server.stop(0)
    with pytest.raises(CheckpointError, match="not 'balance:Balance'; --init_checkpoint_any_problem takes"):
        learner_on(tmp_path / "refused", problem="balance:Balance", init_checkpoint=path)

    with caplog.at_level("INFO", logger="fleetrl.learner.run.run_state"):
        warm = learner_on(tmp_path / "b", problem="balance:Balance", init_checkpoint=path,
                          init_checkpoint_any_problem=True)
    for name, value in source.agent.state_dict().items():
        assert torch.equal(warm.agent.state_dict()[name], value), name
    taken = len(source.agent.state_dict())
    assert f"(problem cartpole): took {taken} tensors" in caplog.text and "left 0" in caplog.text
    warm.server.stop(0)
    with pytest.raises(CheckpointError, match=r"does not fit this agent: baseline\.weight \[1, 64\] in the "
                                              r"checkpoint, \[1, 32\] here; body\.0\.bias"):
        learner_on(tmp_path / "narrow", problem="balance:NarrowBalance", init_checkpoint=path,
                   init_checkpoint_any_problem=True)


def test_fitting_weights_name_what_they_took_left_and_kept():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    saved = {"0.weight": torch.ones(2, 3), "0.bias": torch.ones(2), "head.weight": torch.ones(5)}
    moved = load_fitting_weights({"problem": "other", "model": saved}, model, "x.pt")
    assert (moved.taken, moved.left, moved.kept) == (["0.bias", "0.weight"], ["head.weight"], ["1.bias", "1.weight"])
    assert torch.equal(model[0].weight, torch.ones(2, 3))
    with pytest.raises(CheckpointError, match=r"x.pt \(problem 'other'\) shares no tensor name with this agent"):
        load_fitting_weights({"problem": "other", "model": {"w": torch.ones(1)}}, model, "x.pt")


SAVER = textwrap.dedent("""
    import sys, torch
    from fleetrl.learner.run.checkpoint import CheckpointDir
    checkpoints = CheckpointDir(sys.argv[1], keep=2)
    step = int(sys.argv[2])
    weights = torch.zeros(4_000_000)  # 16 MB: each save takes long enough to be killed inside
    print("ready", flush=True)
    while True:
        step += 1
        checkpoints.save({"format": 2, "problem": "p", "model": {"w": weights + step}, "policy_version": step})
""")


@pytest.mark.slow  # 15 savers killed mid-write
def test_sigkill_during_saves_never_breaks_the_latest_checkpoint(tmp_path):
    directory = str(tmp_path / "checkpoints")
    rng = np.random.default_rng(0)
    step = 0
    for _ in range(15):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, directory, str(step)], stdout=subprocess.PIPE)
        assert saver.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 0.6))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        latest = CheckpointDir(directory).latest()
        if latest is None:
            continue
        checkpoint = load_checkpoint(latest)
        step = checkpoint["policy_version"]
        assert torch.all(checkpoint["model"]["w"] == step), "a checkpoint holds another save's data"
        assert os.path.basename(latest) == f"ckpt-{step:010d}.pt"
    assert step > 0, "no save ever completed"


def test_a_learner_writes_a_final_checkpoint_when_the_run_ends(tmp_path, running_learner):
    with running_learner(tmp_path, checkpoint_interval_s=0) as learner:
        assert CheckpointDir(os.path.join(learner.config.logdir, "checkpoints")).latest() is None
    assert CheckpointDir(os.path.join(learner.config.logdir, "checkpoints")).latest() is not None


def test_a_logdir_that_holds_another_problems_run_is_named_with_the_fix(tmp_path):
    """It resumes from its logdir: a run of another Problem there is refused, saying so."""
    first = learner_on(tmp_path)
    first.run_state.save()
    first.server.stop(0)
    with pytest.raises(ValueError, match=r"holds a run of problem 'cartpole' .*pick a new --logdir for this "
                                         r"'pendulum' run"):
        learner_on(tmp_path, problem="pendulum")


def test_a_launchers_child_shows_only_its_own_lines_of_a_log_an_earlier_run_wrote(tmp_path):
    import sys

    from fleetrl.launch.processes import ChildProcesses

    log = tmp_path / "learner.log"
    log.write_text("an earlier run's line\n")
    children = ChildProcesses()
    child = children.start("learner", [sys.executable, "-c", "print('this run')"], str(log))
    child.process.wait(timeout=60)
    assert child.tail() == "this run\n" and "an earlier run's line" in log.read_text()


def test_export_takes_a_run_folder_as_evaluate_and_init_checkpoint_do(tmp_path):
    import subprocess
    import sys

    learner = learner_on(tmp_path / "run")
    learner.run_state.save()
    learner.server.stop(0)
    output = tmp_path / "model.pt"
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.export", f"--checkpoint={tmp_path / 'run'}",
                             f"--output={output}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert torch.load(output, weights_only=True)["problem"] == "cartpole"
