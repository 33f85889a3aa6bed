"""Teacher forcing: oracle actions in forced episodes, per-episode draws, and the loss mix."""

import dataclasses

import numpy as np
import pytest
import torch

from fleetrl.actor.extras import vector_extras
from fleetrl.envs.grid_nav import GridNavEnv
from fleetrl.envs.teacher_forcing import TeacherForcingDraws, episode_group, episode_groups
from fleetrl.envs.vector import make_vector_env
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems import load_problem

T, ENVS = 4, 16


def test_the_oracle_walks_a_shortest_path():
    env = GridNavEnv(size=9, max_steps=100)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        distance = int(np.abs(env.goal - env.position).sum())
        for steps in range(1, 100):  # noqa: B007 (read after the loop)
            obs, reward, terminated, truncated, info = env.step(obs["oracle_action"])
            if terminated:
                break
        assert steps == distance and reward == 1.0 and info["success"]


def run_inference(problem, steps=T + 1, seed=0):
    """The actor's envs (`make_actor_env`, which draws each episode's teacher forcing) and
    the learner's inference step, without gRPC; yields each step, then the batch."""
    agent = problem.make_agent()
    store = build_state_store(problem, agent, T, torch.device("cpu"))
    unrolls = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True,
                              torch.device("cpu"))
    envs = make_vector_env(problem.make_actor_env, ENVS)
    obs, info = envs.reset(seed=list(range(seed, seed + ENVS)))
    slots, run_ids = store.allocate(ENVS), np.arange(1, ENVS + 1, dtype=np.uint64)
    reward, terminated, truncated = np.zeros(ENVS, np.float32), np.zeros(ENVS, bool), np.zeros(ENVS, bool)
    for _ in range(steps):
        extras = vector_extras(info, problem.extra_specs(), ENVS)
        (actions,) = inference([StepRequest(slots=slots, run_ids=run_ids, observation=obs, extras=extras,
                                            reward=reward, terminated=terminated, truncated=truncated)])
        yield obs, actions["action"], extras["teacher_forcing"]
        obs, reward, terminated, truncated, info = envs.step(actions["action"])
        reward = reward.astype(np.float32)
    yield UnrollBatch.collate(unrolls)


def test_forced_episodes_execute_the_oracle_and_the_draw_holds_for_the_episode():
    problem = load_problem("grid_nav", {"teacher_forcing_fraction": "0.5"})
    assert [s.name for s in problem.extra_specs()] == ["teacher_forcing"]
    *steps, batch = list(run_inference(problem))
    first_forced = steps[0][2]
    assert 0 < first_forced.sum() < ENVS  # about half of the episodes
    for obs, actions, forced in steps:
        assert (forced == first_forced).all()  # no episode ended in these few steps
        assert (actions[forced] == obs["oracle_action"][forced]).all()
    assert (batch.extras["teacher_forcing"] == torch.from_numpy(first_forced)).all()


def test_each_episode_draws_anew_and_a_seed_repeats_the_draws():
    def draws(seed):
        env = TeacherForcingDraws(GridNavEnv(), fraction=0.5)
        first = [env.reset(seed=seed)[1]["teacher_forcing"]]
        return first + [env.reset()[1]["teacher_forcing"] for _ in range(199)]

    assert draws(3) == draws(3) and draws(3) != draws(4)
    assert 70 < sum(draws(3)) < 130
    env = TeacherForcingDraws(GridNavEnv(max_steps=3), fraction=1.0)
    env.reset(seed=0)
    assert all(env.step(0)[4]["teacher_forcing"] for _ in range(3))  # every step of the episode says so
    assert load_problem("grid_nav", {"teacher_forcing_fraction": "0.0"}).extra_specs() == ()


def test_forced_episodes_go_to_their_own_episode_group():
    problem = load_problem("grid_nav", {"teacher_forcing_fraction": "0.5"})
    assert episode_groups(problem.config.teacher_forcing_fraction) == ("train", "teacher")
    assert episode_groups(0.0) == ("train",)
    assert episode_group({"teacher_forcing": True}) == "teacher"
    assert episode_group({"teacher_forcing": False}) == "train"


def test_forced_steps_train_by_cross_entropy_and_the_rest_by_rl():
    """Computed here from the agent's logits, not by the loss code: the cross-entropy of the
    executed (oracle) actions over the forced episodes' transitions, weighted by
    teacher_forcing_cost; and the RL part blind to the forced episodes' rewards."""
    *_, batch = list(run_inference(load_problem("grid_nav", {"teacher_forcing_fraction": "0.5"})))
    agent = load_problem("grid_nav").make_agent()

    def loss_of(batch, cost):
        problem = load_problem("grid_nav", {"teacher_forcing_fraction": "0.5", "teacher_forcing_cost": str(cost)})
        algorithm = problem.algorithm()
        torch.manual_seed(0)
        return algorithm.loss(problem, agent, batch, algorithm.prepare(problem, batch))

    with torch.no_grad():
        outputs, _ = agent.unroll(batch.observation, batch.first, batch.initial_state)
        log_probs = torch.log_softmax(outputs["policy_logits"], -1)
        log_probs = log_probs.gather(-1, batch.action["action"][..., None])[..., 0]
        valid = ~(batch.terminated | batch.truncated)[:-1]  # a transition out of an episode's last step is none
        forced = batch.extras["teacher_forcing"][:-1] & valid
        expected_ce = -log_probs[:-1][forced].mean()
    assert 0 < forced.sum() < valid.sum()
    with_ce, without = loss_of(batch, 2.0), loss_of(batch, 0.0)
    assert with_ce.logs["loss/teacher_forcing"].item() == pytest.approx(expected_ce.item(), rel=1e-5)
    assert with_ce.loss.item() - without.loss.item() == pytest.approx(2.0 * expected_ce.item(), rel=1e-4)
    assert with_ce.logs["teacher_forcing/fraction"].item() == pytest.approx((forced.sum() / valid.sum()).item())

    def with_rewards_changed(envs):
        reward = batch.reward.clone()
        reward[:, envs] += 5.0
        return dataclasses.replace(batch, reward=reward)

    forced_envs = batch.extras["teacher_forcing"][0]
    assert loss_of(with_rewards_changed(forced_envs), 0.0).loss.item() == pytest.approx(without.loss.item())
    assert loss_of(with_rewards_changed(~forced_envs), 0.0).loss.item() != pytest.approx(without.loss.item())


def test_supervised_alone_trains_only_on_forced_steps():
    problem = load_problem("grid_nav", {"algorithm": "supervised", "teacher_forcing_fraction": "1.0"})
    *_, batch = list(run_inference(problem))
    assert batch.extras["teacher_forcing"].all()
    agent = problem.make_agent()
    algorithm = problem.algorithm()
    result = algorithm.loss(problem, agent, batch, algorithm.prepare(problem, batch))
    loss, logs = result.loss, result.logs
    assert loss.item() == pytest.approx(logs["loss/teacher_forcing"].item())
    loss.backward()
    assert agent.policy.weight.grad.abs().sum() > 0
