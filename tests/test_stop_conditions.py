"""When a run ends by itself: a train return target, an eval metric target (the best round
whose best.pt was written), or a budget of env steps; the first reason is the one reported."""

import torch

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner


def learner_with(tmp_path, **config):
    return Learner(LearnerConfig(problem="cartpole", bind="127.0.0.1:0", logdir=str(tmp_path), **config))


def offer(learner, value):
    """An eval round's result, as EvalResults hands it over: best.pt is written if it is better."""
    return learner.run_state.offer_best(value, learner.agent.state_dict(), learner.policy.version, {"x": value})


def test_an_eval_target_stops_the_run_once_a_round_reaches_it_and_its_best_pt_is_written(tmp_path):
    learner = learner_with(tmp_path, best_metric="success", target_eval_metric=0.9)
    conditions = learner.stop_conditions
    assert conditions.reason_to_stop() is None
    assert offer(learner, 0.5) and conditions.reason_to_stop() is None
    assert offer(learner, 0.92)
    assert conditions.reason_to_stop() == "target reached: eval success 0.92 >= 0.9"
    assert torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)["best"] == 0.92
    learner.server.stop(0)


def test_with_best_mode_min_the_target_is_a_ceiling(tmp_path):
    learner = learner_with(tmp_path, best_metric="NE", best_mode="min", target_eval_metric=3.0)
    offer(learner, 5.0)
    assert learner.stop_conditions.reason_to_stop() is None
    offer(learner, 2.5)
    assert learner.stop_conditions.reason_to_stop() == "target reached: eval NE 2.5 <= 3"
    learner.server.stop(0)


def test_the_return_target_and_the_env_step_budget(tmp_path):
    learner = learner_with(tmp_path, target_mean_return=100.0, return_window=2, total_env_steps=1000)
    conditions = learner.stop_conditions
    learner.episodes.extend([{"return": 150.0}])
    assert conditions.reason_to_stop() is None  # one episode, the window wants two
    learner.episodes.extend([{"return": 90.0}])
    assert conditions.reason_to_stop().startswith("target reached: mean return 120.0 >= 100")
    learner.episodes.extend([{"return": 0.0}, {"return": 0.0}])
    learner.inference.env_steps = 1000
    assert conditions.reason_to_stop() == "total_env_steps reached (1,000)"
    learner.server.stop(0)


def test_a_run_without_a_target_reports_none_reached(tmp_path):
    learner = learner_with(tmp_path, total_env_steps=10)
    assert learner.summary().target_reached is None
    learner.server.stop(0)
    with_target = learner_with(tmp_path / "b", target_eval_metric=0.5)
    assert with_target.summary().target_reached is False
    with_target.server.stop(0)
