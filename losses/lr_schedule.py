"""The learning rate over a run: constant, or decayed linearly to zero over the run's env steps.

IMPALA and SEED RL decay the learning rate to zero over the run's frames, and CleanRL's
PPO anneals it the same way: late updates become small, so a policy that has converged
is not knocked off its peak by the noise of its own gradients. The rate is a function of
the env steps served so far, so a resumed run continues on the same curve. A run with
no budget (`--total_env_steps=0`) has nothing to decay over: its rate stays constant, and
the learner says so when it starts.
"""

from __future__ import annotations

import torch

SCHEDULES = ("constant", "linear")  # ProblemConfig checks the name against these


class LearningRateSchedule:
    def __init__(self, name: str, total_env_steps: int):
        # Decays only when linear and the run has a budget; otherwise the optimizer is left alone.
        self.decays = name == "linear" and total_env_steps > 0
        self.total_env_steps = total_env_steps

    def factor(self, env_steps: int) -> float:
        """The share of each parameter group's initial rate to use now."""
        return max(0.0, 1.0 - env_steps / self.total_env_steps) if self.decays else 1.0

    def apply(self, optimizer: torch.optim.Optimizer, env_steps: int) -> None:
        """Scales each group's rate from the one it was made with (a Problem's optimizer may
        give its groups different rates)."""
        if not self.decays:
            return
        factor = self.factor(env_steps)
        for group in optimizer.param_groups:
            group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor
