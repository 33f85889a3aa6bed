"""Any registered Gymnasium env by id, with an agent chosen from its spaces.

    python -m fleetrl.launch.local --problem=gym --env_id=Acrobot-v1

As Sample Factory's and CleanRL's users expect: no Problem to write for a standard env.
- Observations: a flat Box (vectors) goes to an MLP with separate policy and value
  networks; an image Box ([H, W, 3] uint8) to the conv agent; a Discrete one is one-hot
  encoded for the MLP. Dict observations need a Problem of one's own (docs/problems.md).
- Actions: Discrete is a categorical policy; Box is a Gaussian one, squashed into its
  bounds as `action_squash` says.

Learning-rate, discount, algorithm and the other ProblemConfig settings apply as to any
Problem (`--learning_rate=...`).
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from fleetrl.agents import Agent, GaussianMLPAgent, MLPAgent
from fleetrl.agents.conv_lstm import ConvLSTMAgent
from fleetrl.common.settings import setting
from fleetrl.envs.env_ids import check_env_id
from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.continuous_control import GaussianPolicyConfig, GaussianPolicyProblem


@dataclasses.dataclass
class GymConfig(GaussianPolicyConfig):
    env_id: str = setting("CartPole-v1", "A registered Gymnasium env id.")
    # Classic control pays about 1 per step, so values run to the hundreds: unscaled, V-trace's
    # advantages drown the entropy bonus (docs/algorithms.md). On Acrobot, 4 of 4 runs reached
    # -100 in 25k-32k env steps at 0.1, against 75k-134k and one that never did at 1.
    reward_scale: float = 0.1
    max_episode_steps: int = setting(0, "Truncate episodes after this many steps; 0: the env's own limit.")
    hidden_sizes: tuple[int, ...] = setting((64, 64), "The MLP's layers (vector observations).")
    conv_channels: tuple[int, ...] = setting((32, 64, 64), "The conv torso's channels (image observations).")
    lstm_size: int = setting(128, "The conv agent's LSTM size (image observations).")

    def __post_init__(self):
        super().__post_init__()
        check_env_id(self.env_id)


class GymProblem(GaussianPolicyProblem):
    name = "gym"
    Config = GymConfig

    def make_env(self) -> gym.Env:
        kwargs = {"disable_env_checker": True}
        if self.config.max_episode_steps:
            kwargs["max_episode_steps"] = self.config.max_episode_steps
        try:
            spec = gym.spec(self.config.env_id)
            creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
            # rgb_array lets recorded episodes draw it; it costs nothing until render() is called.
            if "rgb_array" in getattr(creator, "metadata", {}).get("render_modes", ()):
                kwargs["render_mode"] = "rgb_array"
            env = gym.make(self.config.env_id, **kwargs)
        except gym.error.Error as e:
            raise ValueError(f"problem gym: cannot make env_id {self.config.env_id!r}: {e}") from None
        return _one_hot(env) if isinstance(env.observation_space, gym.spaces.Discrete) else env

    def make_agent(self) -> Agent:
        obs_space, action_space = self._spaces
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"problem gym: {self.config.env_id} observes {type(obs_space).__name__}; this Problem "
                             "takes Box or Discrete observations (write a Problem for others: docs/problems.md)")
        if _is_image(obs_space):
            if not self._discrete_actions:
                raise ValueError(f"problem gym: {self.config.env_id} has image observations and Box actions; the "
                                 "conv agent has a categorical policy only")
            return ConvLSTMAgent(tuple(obs_space.shape[:2]), self.action_policy().policy_logits_size(),
                                 tuple(self.config.conv_channels), lstm_size=self.config.lstm_size,
                                 image_key="observation")
        size = int(np.prod(obs_space.shape))
        if self._discrete_actions:
            return MLPAgent(size, self.action_policy().policy_logits_size(), self.config.hidden_sizes,
                            shared_torso=False)
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"problem gym: {self.config.env_id} acts in {type(action_space).__name__}; this Problem "
                             "takes Discrete or Box actions")
        return GaussianMLPAgent(size, int(np.prod(action_space.shape)), self.config.hidden_sizes,
                                initial_log_std=self.config.initial_log_std)

    @property
    def _discrete_actions(self) -> bool:
        return isinstance(self._spaces[1], (gym.spaces.Discrete, gym.spaces.MultiDiscrete))

    def action_policy(self) -> ActionPolicy:
        """Categorical for Discrete actions, Gaussian for Box."""
        if self._discrete_actions:
            return ActionPolicy(self.config, self.action_space(), problem=self)
        return super().action_policy()


def _is_image(space: gym.spaces.Box) -> bool:
    return space.dtype == np.uint8 and len(space.shape) == 3 and space.shape[2] == 3


def _one_hot(env: gym.Env) -> gym.Env:
    n = int(env.observation_space.n)
    eye = np.eye(n, dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda o: eye[o], gym.spaces.Box(0.0, 1.0, (n,), np.float32))
