"""The gym_cards tasks for a vision-language agent that reasons, then answers in text (RL4VLM).

Registered as gym_cards/numberline_vlm, gym_cards/ezpoints_vlm, gym_cards/points24_vlm
and gym_cards/blackjack_vlm. Each prompt has RL4VLM's four parts: the task, the state as
text where `observation_text` puts it there (`{observation_text}`; the paper's gym_cards
prompts have none: the image is the state), the legal actions, and the output format
`{"thoughts": "...", "action": "..."}`.

Each task's solver (`fleetrl.envs.gym_cards.solvers`) is the oracle: with
`teacher_forcing_fraction` > 0 the observation carries its answer, which teacher-forced
episodes play and learn from. A warm start is `algorithm=supervised` with
`teacher_forcing_fraction=1` for as many env steps as demonstrations wanted, and
`solver_accuracy` below 1 makes the solver name a wrong action in that share of steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from fleetrl.common.settings import check_range, setting
from fleetrl.envs.gym_cards import ENVS
from fleetrl.envs.gym_cards.solvers import solve
from fleetrl.envs.observation_text import ObservationText
from fleetrl.problems.gym_cards import card_env
from fleetrl.problems.vlm import VLMConfig, VLMProblem, sample_answers

FORMAT = ('Answer with a JSON object {"thoughts": "...", "action": "..."}: first your reasoning, '
          'then one legal action.')

NUMBERLINE = ("You are playing NumberLine. The image shows a target number and a current number, each from 0 to "
              "5. Move the current number to the target one step at a time.\n{observation_text}"
              'Legal actions: "-" (subtract one) and "+" (add one).\n' + FORMAT)
EZPOINTS = ("You are playing EZPoints. The image shows two cards; J, Q and K count as 10. Build a formula that "
            "uses each card's number once, with + and *, and equals 12, one token per step, then end it with "
            '"=".\n{observation_text}Legal actions: "1" to "10", "+", "*" and "=".\n' + FORMAT)
POINTS24 = ("You are playing Points24. The image shows four cards; J, Q and K count as 10. Build a formula that "
            "uses each card's number once, with +, -, *, / and parentheses, and equals 24, one token per step, "
            'then end it with "=".\n{observation_text}Legal actions: "1" to "10", "+", "-", "*", "/", "(", ")" '
            'and "=".\n' + FORMAT)
BLACKJACK = ("You are playing Blackjack. The image shows the dealer's face-up card beside a face-down one, and "
             "your cards. Get closer to 21 than the dealer without going over.\n{observation_text}"
             'Legal actions: "stand" and "hit".\n' + FORMAT)


@dataclasses.dataclass
class GymCardsVLMConfig(VLMConfig):
    image_size: int = setting(32, "The side of the image the model reads, in pixels (a real model's processor "
                                  "resizes it again to its own).")
    max_episode_steps: int = setting(300, "Episodes are truncated after this many steps.")
    observation_text: bool = setting(False, "Write the env's text description of the state into the prompt "
                                            "(RL4VLM's gym_cards prompts have none: the image is the state).")
    solver_accuracy: float = setting(1.0, "The share of steps in which the solver (the teacher-forcing oracle) "
                                          "names the right action; in the others it names another legal one.")
    solvable_only: bool = setting(False, "Points24 only: deal only hands that can make 24.")

    def __post_init__(self):
        super().__post_init__()
        check_range("solver_accuracy", self.solver_accuracy, low=0, high=1)
        check_range("image_size", self.image_size, low=16)


class GymCardsVLMProblem(VLMProblem):
    Config = GymCardsVLMConfig
    TASK: ClassVar[str] = ""

    def make_text_env(self) -> gym.Env:
        c = self.config
        return card_env(self.TASK, c.image_size, c.solvable_only, c.max_episode_steps,
                        wrap=ObservationText if c.observation_text else None,
                        oracle_accuracy=c.solver_accuracy if c.teacher_forcing_fraction > 0 else None,
                        oracle_text_bytes=c.max_text_bytes)

    def corpus(self) -> list[str]:
        task = ENVS[self.TASK]
        answers = sample_answers(lambda: task(image_size=16), solve, episodes=200)
        return [self.prompt(), *answers]

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        return {"success": float(final_info["success"]), **super().episode_metrics(final_info)}

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("success", *super().episode_metric_names())

    def render_frame(self, observation: Mapping[str, np.ndarray], env: gym.Env | None = None) -> np.ndarray:
        return observation["image"]


@dataclasses.dataclass
class NumberLineVLMConfig(GymCardsVLMConfig):
    # NumberLine's episodes last at most 10 steps (2 * max_position), as in the original.
    max_episode_steps: int = 10


class NumberLineVLMProblem(GymCardsVLMProblem):
    Config = NumberLineVLMConfig
    name = "gym_cards/numberline_vlm"
    TASK = "NumberLine"
    PROMPT = NUMBERLINE


class EZPointsVLMProblem(GymCardsVLMProblem):
    name = "gym_cards/ezpoints_vlm"
    TASK = "EZPoints"
    PROMPT = EZPOINTS


@dataclasses.dataclass
class Points24VLMConfig(GymCardsVLMConfig):
    # The solver's answers take up to about 60 tokens of the tiny model's tokenizer (a
    # four-card formula in the thoughts): room for them, and for a real model's longer ones.
    max_new_tokens: int = 128
    max_text_bytes: int = 384


class Points24VLMProblem(GymCardsVLMProblem):
    Config = Points24VLMConfig
    name = "gym_cards/points24_vlm"
    TASK = "Points24"
    PROMPT = POINTS24


class BlackjackVLMProblem(GymCardsVLMProblem):
    name = "gym_cards/blackjack_vlm"
    TASK = "Blackjack"
    PROMPT = BLACKJACK


__all__ = ("GymCardsVLMConfig", "GymCardsVLMProblem", "NumberLineVLMProblem", "EZPointsVLMProblem",
           "Points24VLMProblem", "BlackjackVLMProblem")
