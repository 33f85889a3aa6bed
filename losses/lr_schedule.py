"""The learning rate over a run: an optional warmup, then constant or decayed linearly to zero.

IMPALA and SEED RL decay the learning rate to zero over the run's frames, and CleanRL's
PPO anneals it the same way: late updates become small, so a policy that has converged
is not knocked off its peak by the noise of its own gradients. The rate is a function of
the env steps served so far, so a resumed run continues on the same curve. A run with
no budget (`--total_env_steps=0`) has nothing to decay over: its rate stays constant, and
the learner says so when it starts.

The warmup is for fine-tuning. A fresh Adam has no second-moment history, so its first
update moves every parameter by about the full rate, whatever its gradient's size; a
warm-started or pretrained model can be knocked far off by it (one such step moved a tiny
warm-started VLM's answers by a KL of 0.03 to 2.5, depending on the warm start, and by 5 to
40 times less at a tenth of the rate). Over its first `warmup_updates` optimizer steps the
rate rises linearly to its value, as language-model fine-tuning does. It counts the
policy's optimizer steps, so a resumed run, whose Adam keeps its history, does not warm up
again.
"""

from __future__ import annotations

import torch

SCHEDULES = ("constant", "linear")  # ProblemConfig checks the name against these


class LearningRateSchedule:
    def __init__(self, name: str, total_env_steps: int, warmup_updates: int = 0):
        # Decays only when linear and the run has a budget; otherwise the optimizer is left alone.
        self.decays = name == "linear" and total_env_steps > 0
        self.total_env_steps = total_env_steps
        self.warmup_updates = warmup_updates

    def factor(self, env_steps: int, updates: int = 0) -> float:
        """The share of each parameter group's initial rate for the optimizer step after
        `updates` steps, with `env_steps` served."""
        decay = max(0.0, 1.0 - env_steps / self.total_env_steps) if self.decays else 1.0
        warmup = min(1.0, (updates + 1) / self.warmup_updates) if self.warmup_updates else 1.0
        return decay * warmup

    def apply(self, optimizer: torch.optim.Optimizer, env_steps: int, updates: int = 0) -> None:
        """Scales each group's rate from the one it was made with (a Problem's optimizer may
        give its groups different rates)."""
        if not self.decays and not self.warmup_updates:
            return
        factor = self.factor(env_steps, updates)
        for group in optimizer.param_groups:
            group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor
