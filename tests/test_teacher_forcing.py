"""Teacher forcing: oracle actions in forced episodes, per-episode draws, and the loss mix."""

import numpy as np
import pytest
import torch

from fleetrl.envs.grid_nav import GridNavEnv
from fleetrl.learner.inference import InferenceStep, PolicyVersion, StepRequest
from fleetrl.learner.learner import build_state_store
from fleetrl.learner.unroll_queue import collate
from fleetrl.problems import load_problem

T, ENVS = 4, 16


def test_the_oracle_walks_a_shortest_path():
    env = GridNavEnv(size=9, max_steps=100)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        distance = int(np.abs(env.goal - env.position).sum())
        for steps in range(1, 100):
            obs, reward, terminated, truncated, info = env.step(obs["oracle_action"])
            if terminated:
                break
        assert steps == distance and reward == 1.0 and info["success"]


def run_inference(problem, steps=T + 1, seed=0):
    agent = problem.make_agent()
    store = build_state_store(problem, agent, T, torch.device("cpu"))
    unrolls = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True,
                              torch.device("cpu"), seed=seed)
    envs = [GridNavEnv() for _ in range(ENVS)]
    observations = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    slots, run_ids = store.allocate(ENVS), np.arange(1, ENVS + 1, dtype=np.uint64)
    no = np.zeros(ENVS, bool)
    for _ in range(steps):
        obs = {k: np.stack([o[k] for o in observations]) for k in observations[0]}
        (actions,) = inference([StepRequest(slots, run_ids, obs, np.zeros(ENVS, np.float32), no, no)])
        forced = store.teacher_forcing(slots)
        yield obs, actions["action"], forced
        observations = [env.step(a)[0] for env, a in zip(envs, actions["action"])]
    yield collate(unrolls)


def test_forced_episodes_execute_the_oracle_and_the_draw_holds_for_the_episode():
    problem = load_problem("grid_nav", {"teacher_forcing_fraction": "0.5"})
    *steps, batch = list(run_inference(problem))
    first_forced = steps[0][2]
    assert 0 < first_forced.sum() < ENVS  # about half of the episodes
    for obs, actions, forced in steps:
        assert (forced == first_forced).all()  # no episode ended in these few steps
        assert (actions[forced] == obs["oracle_action"][forced]).all()
    assert (batch.teacher_forcing == torch.from_numpy(first_forced)).all()


def test_forced_steps_train_by_cross_entropy_and_the_rest_by_rl():
    problem = load_problem("grid_nav", {"teacher_forcing_fraction": "0.5", "teacher_forcing_cost": "2.0"})
    *_, batch = list(run_inference(problem))
    agent = problem.make_agent()
    algorithm = problem.algorithm()
    prepared = algorithm.prepare(problem, batch)
    loss, logs = algorithm.loss(problem, agent, batch, prepared)
    with torch.no_grad():
        outputs, _ = agent.unroll(batch.observation, batch.first, batch.initial_state)
        log_probs = problem.action_log_prob(outputs, batch.action)[:-1]
        forced = prepared["valid"] * prepared["teacher"]
        expected_ce = -(log_probs * forced).sum() / forced.sum()
        rl_only, _ = algorithm.rl_loss(problem, outputs, batch, {**prepared, "valid": prepared["valid"] * (1 - prepared["teacher"])})
    assert logs["loss/teacher_forcing"].item() == pytest.approx(expected_ce.item(), rel=1e-5)
    assert loss.item() == pytest.approx(rl_only.item() + 2.0 * expected_ce.item(), rel=1e-5)
    assert 0 < logs["teacher_forcing/fraction"].item() < 1


def test_supervised_alone_trains_only_on_forced_steps():
    problem = load_problem("grid_nav", {"algorithm": "supervised", "teacher_forcing_fraction": "1.0"})
    *_, batch = list(run_inference(problem))
    assert batch.teacher_forcing.all()
    agent = problem.make_agent()
    algorithm = problem.algorithm()
    loss, logs = algorithm.loss(problem, agent, batch, algorithm.prepare(problem, batch))
    assert loss.item() == pytest.approx(logs["loss/teacher_forcing"].item())
    loss.backward()
    assert agent.policy.weight.grad.abs().sum() > 0
