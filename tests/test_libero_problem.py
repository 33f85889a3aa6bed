"""The libero Problem: its eval set, and a short run of the whole system on real LIBERO."""

import json

import pytest
import torch

from fleetrl.learner.evaluation.eval_rounds import EvalRounds
from fleetrl.problems import load_problem


def test_eval_rounds_play_every_task_and_trial_exactly_once_across_eval_actors():
    problem = load_problem("libero", {"suite": "libero_goal", "task_ids": "[2,5,7]", "eval_trials_per_task": "4"})
    assert problem.num_eval_episodes() == 12
    rounds = EvalRounds(lambda: (None, 0), problem.num_eval_episodes(), interval_s=0.0)
    played = []
    actors = ["a", "b", "c"]
    while len(played) < 12:
        for actor in actors:
            work = rounds.work(actor, max_episodes=2)
            for episode in work.episodes:
                _, options = problem.eval_reset(episode)
                played.append((options["task_index"], options["trial"]))
                rounds.record(actor, episode, {"success_once": 0.0})
    assert sorted(played) == [(t, j) for t in range(3) for j in range(4)]
    assert rounds.completed == 1


def test_episode_metrics_report_success_per_task():
    problem = load_problem("libero", {"suite": "libero_10"})
    metrics = problem.episode_metrics({"success_once": True, "episode_len": 37, "task_id": 4, "return": 5.0})
    assert metrics == {"success_once": 1.0, "episode_len": 37.0, "task_4/success": 1.0}


@pytest.mark.libero
def test_training_may_render_without_msaa_or_with_light_meshes_but_eval_renders_as_libero_does():
    problem = load_problem("libero", {"suite": "libero_10", "msaa": "False", "episodes_per_task": "4",
                                      "mesh_detail": "0.25"})
    train, evaluate = problem.make_actor_env(), problem.make_eval_env()
    assert (train.unwrapped.msaa, evaluate.unwrapped.msaa) == (False, True)
    assert (train.unwrapped.mesh_detail, evaluate.unwrapped.mesh_detail) == (0.25, 1.0)
    assert train.unwrapped.episodes_per_task == 4 and train.unwrapped.soft_reset
    with pytest.raises(ValueError, match="episodes_per_task"):
        load_problem("libero", {"episodes_per_task": "0"})
    for detail in ("0", "1.5"):
        with pytest.raises(ValueError, match="mesh_detail"):
            load_problem("libero", {"mesh_detail": detail})


@pytest.mark.slow
@pytest.mark.libero
def test_a_learner_and_one_actor_train_on_real_libero_with_action_chunks(tmp_path, local_run):
    """The flags a user types (--suite, --task_ids, ... are the Problem's own); one env, so
    in-process; 24 chunks of 4 actions in 16-action episodes, batches of one 4-step unroll."""

    logdir = tmp_path / "run"
    process, tag = local_run.start(
        logdir, "--problem=libero", "--suite=libero_spatial", "--task_ids=[0]", "--image_size=32",
        "--chunk_size=4", "--max_episode_steps=16", "--num_wait_steps=2", "--minibatches=1", "--num_actors=1",
        "--envs_per_actor=1", "--unroll_length=4", "--batch_size=1", "--total_env_steps=24", "--seed=0")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["trainer_steps"] >= 1 and summary["episodes"] >= 4, summary
    scalars = local_run.read_scalars(logdir)
    for tag_ in ("episode/success_once", "episode/episode_len", "episode/task_0/success", "loss/policy",
                 "ppo/approx_kl"):
        assert tag_ in scalars, sorted(scalars)
    assert set(scalars["episode/episode_len"]) == {16.0}  # 4 chunks of 4 actions each, then truncation
    checkpoint = torch.load(max((logdir / "checkpoints").glob("ckpt-*.pt")), weights_only=True)
    assert checkpoint["problem"] == "libero"
    assert checkpoint["hparams"]["suite"] == "libero_spatial" and checkpoint["hparams"]["chunk_size"] == "4"


@pytest.mark.slow
@pytest.mark.libero
def test_grpo_trains_on_real_libero_with_a_group_of_envs_in_subprocesses(tmp_path, local_run):
    """GRPO's group of two shares each reset state (tested in test_libero_env); here the whole
    path runs: one actor, its two envs in subprocesses, 8-action episodes in chunks of 4."""

    logdir = tmp_path / "run"
    process, tag = local_run.start(
        logdir, "--problem=libero", "--suite=libero_spatial", "--task_ids=[0]", "--image_size=32",
        "--chunk_size=4", "--max_episode_steps=8", "--num_wait_steps=1", "--algorithm=grpo", "--group_size=2",
        "--num_actors=1", "--envs_per_actor=2", "--unroll_length=4", "--batch_size=2", "--total_env_steps=24",
        "--seed=0")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    assert "stepping 2 envs in subprocesses" in (logdir / "logs" / "actor-0.log").read_text()
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["trainer_steps"] >= 1 and summary["episodes"] >= 4, summary
    scalars = local_run.read_scalars(logdir)
    assert "loss/policy" in scalars and set(scalars["episode/episode_len"]) == {8.0}
