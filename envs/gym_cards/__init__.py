"""The RL4VLM card and number tasks as Gymnasium envs with image observations.

Registered as fleetrl/NumberLine-v0, fleetrl/EZPoints-v0, fleetrl/Points24-v0 and
fleetrl/Blackjack-v0; rules as in RL4VLM (Zhai et al. 2024, "Fine-Tuning Large
Vision-Language Models as Decision-Making Agents via Reinforcement Learning").
"""

import gymnasium as gym

from fleetrl.envs.gym_cards.blackjack import BlackjackEnv
from fleetrl.envs.gym_cards.formula import EZPointsEnv, Points24Env
from fleetrl.envs.gym_cards.numberline import NumberLineEnv
from fleetrl.envs.text_to_action import ParsedAction, text_to_action

ENVS = {"NumberLine": NumberLineEnv, "EZPoints": EZPointsEnv, "Points24": Points24Env, "Blackjack": BlackjackEnv}
for _name, _cls in ENVS.items():
    if f"fleetrl/{_name}-v0" not in gym.registry:
        gym.register(f"fleetrl/{_name}-v0", entry_point=_cls, max_episode_steps=300)

__all__ = ["BlackjackEnv", "EZPointsEnv", "NumberLineEnv", "ParsedAction", "Points24Env", "text_to_action", "ENVS"]
