"""PointReach with a flow-matching VLA: reach the coloured target the instruction names.

Registered as `point_reach`. The env is `fleetrl.envs.point_reach` (a 2-D point, coloured
targets, an image, the instruction's bytes); the agent is the flow VLA on a PaliGemma
(`model_path=tiny` by default) denoising chunks of `chunk_size` 2-D actions. The recipe:
a warm start that imitates the scripted expert (`algorithm=supervised,
teacher_forcing_fraction=1`, `expert_accuracy` below 1 for a noisy one), then PPO from
that checkpoint (`--init_checkpoint`). Eval success is the share of episodes that touch
the named target. The defaults (2 targets on fixed slots, the whole tiny model training)
are what the tiny model learns on a CPU (docs/notes/flow_vla_learning.md).
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym

from fleetrl.common.settings import check_choice, check_range, setting
from fleetrl.envs.point_reach import COLOURS, LAYOUTS, PointReachEnv
from fleetrl.problems.flow_vla import FlowVLAConfig, FlowVLAProblem


@dataclasses.dataclass
class PointReachConfig(FlowVLAConfig):
    image_size: int = setting(32, "The image's side, in pixels.")
    num_targets: int = setting(2, "Coloured targets in the arena (at most 6). The tiny model learns 2 on slots in "
                                  "minutes on a CPU, 3 not in 2,000 steps (docs/notes/flow_vla_learning.md).")
    layout: str = setting("slots", "slots: the targets at fixed places, their colours drawn each episode; random: "
                                   "anywhere, a harder task to learn from pixels.")
    max_episode_steps: int = setting(30, "Env steps (actions) before truncation.")
    expert_accuracy: float = setting(1.0, "The share of episodes in which the scripted expert (the oracle) heads "
                                          "for the named target; in the others it heads for another one.")
    expert_heading_error: float = setting(0.0, "The scripted expert steers off its goal by an angle drawn each "
                                               "episode, uniform in +-this many degrees: it curves in and takes "
                                               "longer, a noisy demonstrator that a tight max_episode_steps fails.")
    chunk_size: int = 4
    # The tiny random prefix has nothing to offer frozen: it learns with the rest.
    train_prefix: bool = True
    train_vision: bool = True
    learning_rate: float = 1e-3

    def __post_init__(self):
        super().__post_init__()
        check_range("expert_accuracy", self.expert_accuracy, low=0, high=1)
        check_range("num_targets", self.num_targets, low=1, high=len(COLOURS))
        check_choice("layout", self.layout, LAYOUTS)
        check_range("expert_heading_error", self.expert_heading_error, low=0, high=90, high_open=True)


class PointReachProblem(FlowVLAProblem):
    name = "point_reach"
    Config = PointReachConfig

    def make_env(self) -> gym.Env:
        c = self.config
        return PointReachEnv(image_size=c.image_size, num_targets=c.num_targets, max_episode_steps=c.max_episode_steps,
                             oracle_chunk=c.chunk_size if c.teacher_forcing_fraction > 0 else 0,
                             expert_accuracy=c.expert_accuracy, layout=c.layout,
                             expert_heading_error=c.expert_heading_error)

    def corpus(self) -> list[str]:
        return [f"go to the {colour} target" for colour in COLOURS]
