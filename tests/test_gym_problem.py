"""`--problem=gym --env_id=...`: any registered Gymnasium env, with the agent its spaces call for."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.agents import GaussianMLPAgent, MLPAgent
from fleetrl.agents.conv_lstm import ConvLSTMAgent
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.problems.registry import load_problem


class TinyImageEnv(gym.Env):
    """Images of 12 x 16 pixels whose brightness says which of 3 actions pays."""

    observation_space = gym.spaces.Box(0, 255, (12, 16, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._target, self._steps = int(self.np_random.integers(3)), 0
        return self._image(), {}

    def step(self, action):
        self._steps += 1
        reward = float(action == self._target)
        self._target = int(self.np_random.integers(3))
        return self._image(), reward, False, self._steps >= 8, {}

    def _image(self):
        return np.full((12, 16, 3), 80 * self._target, np.uint8)


gym.register("fleetrl_test/TinyImage-v0", entry_point=TinyImageEnv)


def test_vector_observations_and_discrete_actions_get_an_mlp_with_a_value_network_of_its_own():
    problem = load_problem("gym", {"env_id": "Acrobot-v1"})
    agent = problem.make_agent()
    assert isinstance(agent, MLPAgent) and agent.value_body is not None
    assert [(s.name, s.shape) for s in problem.observation_specs()] == [("observation", (6,))]
    out, _ = agent.step({"observation": torch.zeros(2, 6)}, torch.ones(2, dtype=torch.bool), ())
    assert out["policy_logits"].shape == (2, 3)


def test_box_actions_get_a_gaussian_policy_within_the_bounds():
    problem = load_problem("gym", {"env_id": "Pendulum-v1"})
    agent = problem.make_agent()
    assert isinstance(agent, GaussianMLPAgent)
    out, _ = agent.step({"observation": torch.zeros(5, 3)}, torch.ones(5, dtype=torch.bool), ())
    action = problem.select_actor_action(out, {}, {})["action"]
    assert action.shape == (5, 1) and torch.all(action.abs() <= 2.0)
    assert problem.action_log_prob(out, {"action": action}).shape == (5,)


def test_discrete_observations_are_one_hot():
    problem = load_problem("gym", {"env_id": "FrozenLake-v1"})
    env = problem.make_actor_env()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (16,) and obs.sum() == 1 and obs[0] == 1
    assert isinstance(problem.make_agent(), MLPAgent)


def test_an_unknown_env_id_is_refused_by_name():
    with pytest.raises(ValueError, match="cannot make env_id 'NoSuchEnv-v9'"):
        load_problem("gym", {"env_id": "NoSuchEnv-v9"}).observation_specs()


def test_an_image_env_is_served_end_to_end_with_the_conv_agent(tmp_path):
    problem = load_problem("gym", {"env_id": "fleetrl_test/TinyImage-v0", "conv_channels": "[8,8]",
                                   "lstm_size": "16"})
    assert isinstance(problem.make_agent(), ConvLSTMAgent)
    learner = Learner(LearnerConfig(problem="gym", bind="127.0.0.1:0", logdir=str(tmp_path), unroll_length=4,
                                    unroll_queue_size=1000), problem=problem)
    learner.server.start()  # and its batchers
    try:
        Actor(ActorConfig(learner_address=learner.address, problem="gym", num_envs=3), problem).run(max_steps=9)
        batch = learner.unrolls.get_batch(learner.unrolls.qsize())
    finally:
        learner.finish("test over")
        learner.server.stop(0).wait()
    assert batch.batch_size == 3 * 2 and batch.observation["observation"].shape == (5, 6, 12, 16, 3)
    with torch.no_grad():
        outputs, _ = learner.agent.unroll(batch.observation, batch.first, batch.initial_state)
    torch.testing.assert_close(problem.action_log_prob(outputs, batch.action), batch.behaviour_log_prob,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_acrobot_is_learned_by_its_env_id_with_the_defaults(tmp_path, local_run):
    """A random policy scores about -500 (the time limit); -100 swings up in about 100 steps."""
    summary = local_run.train_to_target(tmp_path, "--problem=gym", "--env_id=Acrobot-v1", "--seed=0",
                                        "--total_env_steps=300000", "--target_mean_return=-100")
    assert summary["mean_episode_return"] >= -100 and summary["env_steps"] <= 300_000
